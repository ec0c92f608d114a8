# syntax=docker/dockerfile:1
# Spark image of the kind e2e suite: driver and executors of a Spark-on-Kubernetes job that
# writes with the durable-kafka data source. PySpark from PyPI (the same version as the
# project's tests), Java 17, and this package with its dependencies in the system Python,
# so the Python workers Spark starts on executors can import durable_producer.
# Build from the repository root:
#   docker build -f tests/e2e/images/spark.Dockerfile -t durable-producer/spark-e2e:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG PYSPARK_VERSION=4.3.0
ARG PYARROW_VERSION=26.0.1
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install --yes --no-install-recommends openjdk-17-jre-headless procps tini \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s /usr/lib/jvm/java-17-openjdk-* /opt/java
COPY docker/agent-requirements.txt /tmp/agent-requirements.txt
RUN pip install "pyspark==${PYSPARK_VERSION}" "pyarrow==${PYARROW_VERSION}" --requirement /tmp/agent-requirements.txt
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install --no-deps /src
COPY tests/e2e/images/spark-entrypoint.sh /opt/spark-entrypoint.sh
RUN chmod 0755 /opt/spark-entrypoint.sh \
    && groupadd --system --gid 185 spark \
    && useradd --system --uid 185 --gid 185 --home-dir /tmp --shell /usr/sbin/nologin spark
ENV JAVA_HOME=/opt/java \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=python3 \
    PYTHONUNBUFFERED=1
USER 185:185
WORKDIR /tmp
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/spark-entrypoint.sh"]
