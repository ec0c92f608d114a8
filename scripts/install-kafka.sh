#!/usr/bin/env bash
# Install Apache Kafka's broker jars (KRaft) into <repo>/.tools/kafka/<version>/libs.
#
# They come from Maven Central through the dependencies-only pom scripts/kafka/pom.xml
# (`mvn dependency:copy-dependencies`); durable_producer.local starts the broker from them with
# `java -cp 'libs/*' kafka.Kafka`. Needs mvn and java. Idempotent: a stamp file records the
# pom it was installed from; when it matches, the script exits at once.
#
# Environment overrides:
#   TOOLS_DIR  install root (default: <repo>/.tools)
#   MVN        the Maven command (default: mvn)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${TOOLS_DIR:-$REPO_ROOT/.tools}"
POM="$REPO_ROOT/scripts/kafka/pom.xml"
MVN="${MVN:-mvn}"

log() { echo "[install-kafka] $*"; }
fail() { log "error: $*" >&2; exit 1; }

# The one place the version is written is the pom; the Python side checks it (unit test).
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")"
[[ -n "$KAFKA_VERSION" ]] || fail "no <kafka.version> in $POM"
INSTALL_DIR="$TOOLS_DIR/kafka/$KAFKA_VERSION"
LIBS_DIR="$INSTALL_DIR/libs"
STAMP="$INSTALL_DIR/.installed"
POM_SUM="$(sha256sum "$POM" | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$POM_SUM" && -f "$LIBS_DIR/kafka_2.13-$KAFKA_VERSION.jar" ]]; then
  log "Kafka $KAFKA_VERSION already installed in $LIBS_DIR; nothing to do"
  exit 0
fi

command -v java >/dev/null 2>&1 || [[ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]] \
  || fail "java not found: install Java 17 (Debian: apt-get install openjdk-17-jre-headless)"
command -v "$MVN" >/dev/null 2>&1 \
  || fail "'$MVN' not found: install Maven (Debian: apt-get install maven)"

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/install-kafka.XXXXXX")"
trap 'rm -rf "$WORK_DIR"' EXIT
cp "$POM" "$WORK_DIR/pom.xml"

log "downloading Kafka $KAFKA_VERSION and its runtime dependencies from Maven Central"
started=$SECONDS
if ! (cd "$WORK_DIR" && "$MVN" -q -B dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$WORK_DIR/libs" >"$WORK_DIR/mvn.log" 2>&1); then
  tail -n 20 "$WORK_DIR/mvn.log" >&2
  fail "mvn dependency:copy-dependencies failed (download or resolution error above); retry, or check that Maven Central is reachable"
fi

core="$(cd "$WORK_DIR/libs" && ls log4j-core-*.jar 2>/dev/null || true)"
binding="$(cd "$WORK_DIR/libs" && ls log4j-slf4j-impl-*.jar 2>/dev/null || true)"
[[ -n "$core" && -n "$binding" ]] || fail "log4j-core or log4j-slf4j-impl missing from the resolved jars"
[[ "${core#log4j-core-}" == "${binding#log4j-slf4j-impl-}" ]] \
  || fail "log4j-slf4j-impl ($binding) does not match log4j-core ($core): fix log4j.version in $POM"

rm -rf "$LIBS_DIR"
mkdir -p "$INSTALL_DIR"
mv "$WORK_DIR/libs" "$LIBS_DIR"
echo "$POM_SUM" >"$STAMP"
log "installed $(ls "$LIBS_DIR" | wc -l) jars ($(du -sh "$LIBS_DIR" | cut -f1)) into $LIBS_DIR in $((SECONDS - started)) s"
