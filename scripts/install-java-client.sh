#!/usr/bin/env bash
# Install the Apache Kafka Java client (kafka-clients and its runtime jars, plus an slf4j binding)
# into <repo>/.tools/java-client/<version>/libs, at the version of the local brokers (the
# kafka.version of scripts/kafka/pom.xml).
#
# From Maven Central through the dependencies-only pom scripts/java-client/pom.xml
# (scripts/lib/maven-jars.sh). The tests compile a small producer program against these jars
# with javac (tests/support/java_client.py). Needs mvn and java. Idempotent (stamp file).
#
# Environment overrides:
#   TOOLS_DIR  install root (default: <repo>/.tools)
#   MVN        the Maven command (default: mvn)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${TOOLS_DIR:-$REPO_ROOT/.tools}"
POM="$REPO_ROOT/scripts/java-client/pom.xml"
LOG_TAG=install-java-client
# shellcheck source=lib/maven-jars.sh
source "$REPO_ROOT/scripts/lib/maven-jars.sh"

KAFKA_VERSION="$(pom_property "$REPO_ROOT/scripts/kafka/pom.xml" kafka.version)"
[[ -n "$KAFKA_VERSION" ]] || fail "no <kafka.version> in scripts/kafka/pom.xml"

# kafka-clients calls slf4j 1.7; the binding must be of the same version as the API it brought.
check_jars() {
  local api binding
  api="$(cd "$1" && ls slf4j-api-*.jar 2>/dev/null || true)"
  binding="$(cd "$1" && ls slf4j-simple-*.jar 2>/dev/null || true)"
  [[ -n "$api" && -n "$binding" ]] || fail "slf4j-api or slf4j-simple missing from the resolved jars"
  [[ "${api#slf4j-api-}" == "${binding#slf4j-simple-}" ]] \
    || fail "slf4j-simple ($binding) does not match slf4j-api ($api): fix slf4j.version in $POM"
}

maven_install_jars "$POM" "$TOOLS_DIR/java-client/$KAFKA_VERSION" \
  "kafka-clients-$KAFKA_VERSION.jar" "-Dkafka.version=$KAFKA_VERSION"
