# syntax=docker/dockerfile:1
# The DurableProducer operator (kopf). Image: durable-producer/operator:<version>.
# Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t durable-producer/operator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/durable-producer
COPY docker/operator-requirements.txt /tmp/requirements.txt
RUN /opt/durable-producer/bin/pip install --requirement /tmp/requirements.txt
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN /opt/durable-producer/bin/pip install --no-deps /src

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="durable-producer/operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="DurableProducer operator: sizes buffer volumes and attaches buffer agents" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 durable \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin durable
COPY --from=build /opt/durable-producer /opt/durable-producer
ENV PATH=/opt/durable-producer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# 8080: liveness (/healthz); 9443: admission webhook server.
EXPOSE 8080 9443
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["kopf"]
CMD ["run", "-m", "durable_producer.operator.handlers", "--standalone", "--all-namespaces", "--liveness=http://localhost:8080/healthz"]
