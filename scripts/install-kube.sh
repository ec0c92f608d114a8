#!/usr/bin/env bash
# Build the local Kubernetes control plane's binaries into <repo>/.tools/kube/<version>/bin:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake nodes).
#
# They are built with `go build` from the published Go modules, through the wrapper modules in
# scripts/kube/ (their go.mod files hold every version; go.sum pins every download):
#   scripts/kube/kubernetes  k8s.io/kubernetes, each staging module replaced by its v0.Y release
#   scripts/kube/etcd        go.etcd.io/etcd/server/v3 (etcdmain)
#   scripts/kube/kwok        sigs.k8s.io/kwok (its k8s.io/* versions differ from Kubernetes')
# A cold build takes many minutes and GBs (docs/development.md has the figures); the module
# cache (`go env GOMODCACHE`) and build cache (`go env GOCACHE`) make a rebuild quick.
# Idempotent: a binary that is present and reports the wanted version is not built again.
#
# Environment overrides:
#   TOOLS_DIR   install root (default: <repo>/.tools); binaries go to $TOOLS_DIR/kube/<version>/bin
#   GO          the go command (default: go)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${TOOLS_DIR:-$REPO_ROOT/.tools}"
MODULES_DIR="$REPO_ROOT/scripts/kube"
GO="${GO:-go}"

log() { echo "[install-kube] $*"; }
die() { echo "[install-kube] error: $*" >&2; exit 1; }

# The version a wrapper module requires of a module, read from its go.mod.
required_version() { # <wrapper dir> <module path>
  local version
  version="$(awk -v module="$2" '{ sub(/^require[ \t]+/, "") } $1 == module && $2 ~ /^v/ { print $2; exit }' "$1/go.mod")"
  [[ -n "$version" ]] || die "$1/go.mod requires no $2"
  echo "$version"
}

KUBE_VERSION="$(required_version "$MODULES_DIR/kubernetes" k8s.io/kubernetes)"
ETCD_VERSION="$(required_version "$MODULES_DIR/etcd" go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(required_version "$MODULES_DIR/kwok" sigs.k8s.io/kwok)"
BIN_DIR="$TOOLS_DIR/kube/$KUBE_VERSION/bin"

# What each binary prints for --version, reduced to its version ("" when it cannot run).
reported_version() { # <binary>
  local binary="$BIN_DIR/$1"
  [[ -x "$binary" ]] || return 0
  case "$1" in
    etcd) "$binary" --version 2>/dev/null | awk '/^etcd Version:/ { print "v" $3 }' ;;
    kwok) "$binary" --version 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "version") { print $(i + 1); exit } }' ;;
    *) "$binary" --version 2>/dev/null | awk '/^Kubernetes / { print $2 }' ;;
  esac
}

wanted_version() { # <binary>
  case "$1" in
    etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    *) echo "$KUBE_VERSION" ;;
  esac
}

missing=()
for binary in etcd kube-apiserver kube-controller-manager kube-scheduler kwok; do
  if [[ "$(reported_version "$binary")" != "$(wanted_version "$binary")" ]]; then
    missing+=("$binary")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "etcd $ETCD_VERSION, Kubernetes $KUBE_VERSION and kwok $KWOK_VERSION already in $BIN_DIR; nothing to do"
  exit 0
fi

command -v "$GO" >/dev/null 2>&1 || die "'$GO' is required to build ${missing[*]} but is not on PATH (install Go 1.26 or newer)"
mkdir -p "$BIN_DIR"
# The go lines of the wrapper modules are the minimum; never download another toolchain.
export GOTOOLCHAIN=local
export GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
export CGO_ENABLED=0

# Build into a temporary name and rename, so an interrupted build leaves no half binary.
build() { # <wrapper dir> <ldflags> <output name> <package>
  local started=$SECONDS
  log "building $3 ($4)"
  (cd "$1" && "$GO" build -ldflags "$2" -o "$BIN_DIR/$3.partial" "$4") \
    || die "go build of $3 failed (see the messages above)"
  mv -f "$BIN_DIR/$3.partial" "$BIN_DIR/$3"
  log "built $3 $(reported_version "$3") in $((SECONDS - started)) s"
}

kube_minor="${KUBE_VERSION#v1.}"
kube_minor="${kube_minor%%.*}"
KUBE_LDFLAGS="-s -w"
for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  KUBE_LDFLAGS+=" -X $package.gitVersion=$KUBE_VERSION -X $package.gitMajor=1"
  KUBE_LDFLAGS+=" -X $package.gitMinor=$kube_minor -X $package.gitTreeState=clean"
done

for binary in "${missing[@]}"; do
  case "$binary" in
    etcd) build "$MODULES_DIR/etcd" "-s -w" etcd . ;;
    kwok)
      build "$MODULES_DIR/kwok" "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
        kwok sigs.k8s.io/kwok/cmd/kwok
      ;;
    *) build "$MODULES_DIR/kubernetes" "$KUBE_LDFLAGS" "$binary" "k8s.io/kubernetes/cmd/$binary" ;;
  esac
done

for binary in "${missing[@]}"; do
  got="$(reported_version "$binary")"
  [[ "$got" == "$(wanted_version "$binary")" ]] \
    || die "$BIN_DIR/$binary reports '$got', not $(wanted_version "$binary")"
done
log "installed ${missing[*]} into $BIN_DIR"
