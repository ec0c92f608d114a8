#!/usr/bin/env bash
# Install Apache Kafka's broker jars (KRaft) into <repo>/.tools/kafka/<version>/libs.
#
# They come from Maven Central through the dependencies-only pom scripts/kafka/pom.xml
# (`mvn dependency:copy-dependencies`, scripts/lib/maven-jars.sh); durable_producer.local starts
# the broker from them with `java -cp 'libs/*' kafka.Kafka`. Needs mvn and java. Idempotent: a
# stamp file records the pom it was installed from; when it matches, the script exits at once.
#
# Environment overrides:
#   TOOLS_DIR  install root (default: <repo>/.tools)
#   MVN        the Maven command (default: mvn)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${TOOLS_DIR:-$REPO_ROOT/.tools}"
POM="$REPO_ROOT/scripts/kafka/pom.xml"
LOG_TAG=install-kafka
# shellcheck source=lib/maven-jars.sh
source "$REPO_ROOT/scripts/lib/maven-jars.sh"

# The one place the version is written is the pom; the Python side checks it (unit test).
KAFKA_VERSION="$(pom_property "$POM" kafka.version)"
[[ -n "$KAFKA_VERSION" ]] || fail "no <kafka.version> in $POM"

# Kafka's POMs bring neither log4j-core nor the slf4j 1.7 binding: the pom pins both from one
# property, and without the binding at log4j-core's version the broker logs nothing.
check_jars() {
  local core binding
  core="$(cd "$1" && ls log4j-core-*.jar 2>/dev/null || true)"
  binding="$(cd "$1" && ls log4j-slf4j-impl-*.jar 2>/dev/null || true)"
  [[ -n "$core" && -n "$binding" ]] || fail "log4j-core or log4j-slf4j-impl missing from the resolved jars"
  [[ "${core#log4j-core-}" == "${binding#log4j-slf4j-impl-}" ]] \
    || fail "log4j-slf4j-impl ($binding) does not match log4j-core ($core): fix log4j.version in $POM"
}

maven_install_jars "$POM" "$TOOLS_DIR/kafka/$KAFKA_VERSION" "kafka_2.13-$KAFKA_VERSION.jar"
