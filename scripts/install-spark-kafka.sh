#!/usr/bin/env bash
# Install Spark's own Kafka sink (spark-sql-kafka-0-10 with spark-token-provider-kafka-0-10,
# kafka-clients and commons-pool2) into <repo>/.tools/spark-kafka/<pyspark version>/libs, for
# the installed pyspark: the tests and benchmarks run it beside durable-kafka (spark.jars).
#
# From Maven Central through the dependencies-only pom scripts/spark-kafka/pom.xml
# (scripts/lib/maven-jars.sh), at the installed pyspark's version when Maven Central has that
# release; otherwise at the newest release of the same major version before it, and the script
# says so (Maven Central may lag PyPI). Needs mvn, java and the venv's pyspark. Idempotent:
# reinstalls when pyspark's version changes.
#
# Environment overrides:
#   TOOLS_DIR      install root (default: <repo>/.tools)
#   MVN            the Maven command (default: mvn)
#   PYTHON         the interpreter whose pyspark counts (default: <repo>/.venv/bin/python)
#   MAVEN_CENTRAL  where the sink's versions are listed (default: https://repo.maven.apache.org/maven2)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${TOOLS_DIR:-$REPO_ROOT/.tools}"
POM="$REPO_ROOT/scripts/spark-kafka/pom.xml"
PYTHON="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
LOG_TAG=install-spark-kafka
# shellcheck source=lib/maven-jars.sh
source "$REPO_ROOT/scripts/lib/maven-jars.sh"

PYSPARK_VERSION="$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("pyspark"))' 2>/dev/null)" \
  || fail "no pyspark in $PYTHON: run \`make venv\` first (or set PYTHON)"
SINK=spark-sql-kafka-0-10_2.13
MAVEN_CENTRAL="${MAVEN_CENTRAL:-https://repo.maven.apache.org/maven2}"

# The sink's version: pyspark's own if Maven Central lists it, else the newest release (no
# -preview/-rc) of the same major version before it. Asked only when an install is needed.
install_args() {
  local version
  version="$("$PYTHON" - "$PYSPARK_VERSION" "$MAVEN_CENTRAL/org/apache/spark/$SINK/maven-metadata.xml" <<'PY'
import re
import sys
import urllib.request

wanted, url = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen(url, timeout=60).read().decode()
def numbers(version):
    return tuple(int(part) for part in re.match(r"\d+(?:\.\d+)*", version).group().split("."))
releases = [v for v in re.findall(r"<version>([^<]+)</version>", text) if re.fullmatch(r"\d+\.\d+\.\d+", v)]
if wanted in releases:
    print(wanted)
else:
    older = [v for v in releases if numbers(v)[0] == numbers(wanted)[0] and numbers(v) < numbers(wanted)]
    print(max(older, key=numbers) if older else "")
PY
)" || fail "could not read the versions of $SINK from $MAVEN_CENTRAL (set MAVEN_CENTRAL to a reachable mirror)"
  [[ -n "$version" ]] || fail "Maven Central has no $SINK release for pyspark $PYSPARK_VERSION or an older one of its major version"
  if [[ "$version" != "$PYSPARK_VERSION" ]]; then
    log "note: Maven Central has no $SINK $PYSPARK_VERSION (the installed pyspark); using $version, the newest release before it" >&2
  fi
  echo "-Dspark.kafka.version=$version"
}

maven_install_jars "$POM" "$TOOLS_DIR/spark-kafka/$PYSPARK_VERSION" "$SINK-*.jar" \
  "-Dpyspark.version=$PYSPARK_VERSION" \
  "-DincludeArtifactIds=$SINK,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"
