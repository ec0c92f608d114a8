#!/usr/bin/env bash
# Install the load generators of benchmarks/ingest_bench.py from Debian: a C compiler and
# librdkafka's header (it compiles benchmarks/rdkafka_producer.c against the librdkafka that
# confluent-kafka ships), and kcat (its --client kcat).
#
# A Python producer loop caps near 200k records/s, below what either endpoint can take, so the
# ingest benchmark drives both with librdkafka in C. Idempotent; without root or sudo it says
# what to run and exits 0 (the benchmark then falls back to kcat or to Python producers).
set -euo pipefail

log() { echo "[install-bench-tools] $*"; }

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
[ -f /usr/include/librdkafka/rdkafka.h ] || missing+=(librdkafka-dev)
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  log "missing ${missing[*]} and apt-get is unavailable: install them with your package manager"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  log "run 'sudo apt-get install -y ${missing[*]}' (benchmarks fall back to slower load generators)"
  exit 0
fi
log "installing ${missing[*]} from Debian"
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
  $SUDO apt-get update >/dev/null
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
log "$(kcat -V 2>&1 | head -1); $(cc --version | head -1)"
