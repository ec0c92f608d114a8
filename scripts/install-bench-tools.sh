#!/usr/bin/env bash
# Install kcat (Debian package), the C load generator of benchmarks/ingress_bench.py.
#
# A Python producer loop caps near 200k records/s, below what either endpoint can take, so the
# ingest benchmark drives both with kcat processes (librdkafka in C). Idempotent; without root
# or sudo it says what to run and exits 0 (the benchmark then falls back to Python producers).
set -euo pipefail

log() { echo "[install-bench-tools] $*"; }

if command -v kcat >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  log "kcat not found and apt-get is unavailable: install kcat with your package manager"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  log "kcat not found: run 'sudo apt-get install -y kcat' (benchmarks fall back to Python producers)"
  exit 0
fi
log "installing kcat from Debian"
if ! $SUDO apt-get install -y --no-install-recommends kcat >/dev/null 2>&1; then
  $SUDO apt-get update >/dev/null
  $SUDO apt-get install -y --no-install-recommends kcat >/dev/null
fi
log "$(kcat -V 2>&1 | head -1)"
