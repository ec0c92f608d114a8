# syntax=docker/dockerfile:1
# The buffer agent sidecar. Image: durable-producer/agent:<version>.
# Build from the repository root:
#   docker build -f docker/agent.Dockerfile -t durable-producer/agent:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/durable-producer
# gcc compiles the ingest's record scanner (src/.../kafka/_record_scan.c, setup.py)
RUN apt-get update \
    && apt-get install --yes --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY docker/agent-requirements.txt /tmp/requirements.txt
RUN /opt/durable-producer/bin/pip install --requirement /tmp/requirements.txt
COPY pyproject.toml setup.py README.md /src/
COPY src /src/src
RUN /opt/durable-producer/bin/pip install --no-deps /src

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="durable-producer/agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="Buffer agent: Kafka protocol on 127.0.0.1:9092, write-ahead log, forwarder" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 durable \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin durable \
    && mkdir -p /var/lib/durable-producer \
    && chown 10001:10001 /var/lib/durable-producer
COPY --from=build /opt/durable-producer /opt/durable-producer
ENV PATH=/opt/durable-producer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# The WAL lives here; in Kubernetes it is the operator-managed PersistentVolume.
VOLUME ["/var/lib/durable-producer"]
# 9644: metrics and health (/metrics, /healthz, /readyz). The Kafka listener (9092) binds
# 127.0.0.1 only: it serves the containers of its own pod.
EXPOSE 9644
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9644/healthz', timeout=4)"]
ENTRYPOINT ["durable-agent"]
CMD ["run", "--data-dir", "/var/lib/durable-producer"]
