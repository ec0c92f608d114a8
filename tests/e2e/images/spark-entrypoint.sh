#!/bin/bash
# What Spark's own image entrypoint (resource-managers/kubernetes/docker/.../entrypoint.sh)
# does for an executor pod, for an image built on the PyPI pyspark package. The driver of
# Spark-on-Kubernetes starts executor containers with the single argument "executor" and
# passes everything else in SPARK_* environment variables. Anything else is run as given.
set -eo pipefail

# Spark mounts its scratch volumes at SPARK_LOCAL_DIRS; the working directory must be writable.
if [ -n "${SPARK_LOCAL_DIRS:-}" ]; then
  cd "${SPARK_LOCAL_DIRS%%,*}"
fi
SPARK_CLASSPATH="${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}${SPARK_HOME}/jars/*:${PWD}"
SPARK_EXECUTOR_JAVA_OPTS=()
for variable in "${!SPARK_JAVA_OPT_@}"; do
  SPARK_EXECUTOR_JAVA_OPTS+=("${!variable}")
done

case "${1:-}" in
  executor)
    shift
    exec "${JAVA_HOME}/bin/java" \
      "${SPARK_EXECUTOR_JAVA_OPTS[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_CLASSPATH}:${SPARK_DIST_CLASSPATH:-}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" \
      --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec "$@"
    ;;
esac
