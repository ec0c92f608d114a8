# Sourced by the scripts/install-*.sh that copy jars from Maven Central into .tools/.
#
# Each of them has a dependencies-only pom (nothing is built from it) and calls
#
#   maven_install_jars POM INSTALL_DIR MARKER [mvn arguments...]
#
# which copies the pom's runtime dependencies with `mvn dependency:copy-dependencies` into
# INSTALL_DIR/libs. A stamp file (INSTALL_DIR/.installed) records the pom and the arguments it
# was installed from: when they match and a jar matching MARKER (a glob) is there, it returns at
# once. Two optional hooks of the caller: `install_args` prints further mvn arguments, one a line,
# only when an install is needed (they are not part of the stamp: it may ask the network), and
# `check_jars DIR` runs before the jars are moved into place (to check versions Maven cannot: a
# logging binding that must match its API, say).
#
# The caller sets LOG_TAG (the prefix of every line) and may set MVN (default: mvn).

log() { echo "[$LOG_TAG] $*"; }
fail() { log "error: $*" >&2; exit 1; }

maven_install_jars() {
  local pom="$1" install_dir="$2" marker="$3"
  shift 3
  local libs_dir="$install_dir/libs" stamp="$install_dir/.installed"
  local mvn="${MVN:-mvn}"
  local stamp_text
  stamp_text="$( { sha256sum "$pom" | cut -d' ' -f1; printf '%s\n' "$@"; } | sha256sum | cut -d' ' -f1)"

  if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_text" ]] \
      && compgen -G "$libs_dir/$marker" >/dev/null; then
    log "already installed in $libs_dir; nothing to do"
    return 0
  fi

  command -v java >/dev/null 2>&1 || [[ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]] \
    || fail "java not found: install Java 17 (Debian: apt-get install openjdk-17-jre-headless)"
  command -v "$mvn" >/dev/null 2>&1 \
    || fail "'$mvn' not found: install Maven (Debian: apt-get install maven)"

  local extra=()
  if declare -F install_args >/dev/null; then
    local extra_text
    extra_text="$(install_args)" || exit 1
    mapfile -t extra <<<"$extra_text"
  fi

  local work_dir
  work_dir="$(mktemp -d "${TMPDIR:-/tmp}/$LOG_TAG.XXXXXX")"
  # shellcheck disable=SC2064  # expand now: work_dir is local
  trap "rm -rf '$work_dir'" EXIT
  cp "$pom" "$work_dir/pom.xml"

  log "downloading from Maven Central ($(basename "$(dirname "$pom")")/pom.xml $* ${extra[*]})"
  local started=$SECONDS
  if ! (cd "$work_dir" && "$mvn" -q -B dependency:copy-dependencies -DincludeScope=runtime \
          -DoutputDirectory="$work_dir/libs" "$@" "${extra[@]}" >"$work_dir/mvn.log" 2>&1); then
    tail -n 20 "$work_dir/mvn.log" >&2
    fail "mvn dependency:copy-dependencies failed (download or resolution error above); retry, or check that Maven Central is reachable"
  fi
  compgen -G "$work_dir/libs/$marker" >/dev/null || fail "no $marker among the resolved jars"
  if declare -F check_jars >/dev/null; then
    check_jars "$work_dir/libs"
  fi

  rm -rf "$libs_dir"
  mkdir -p "$install_dir"
  mv "$work_dir/libs" "$libs_dir"
  echo "$stamp_text" >"$stamp"
  log "installed $(ls "$libs_dir" | wc -l) jars ($(du -sh "$libs_dir" | cut -f1)) into $libs_dir in $((SECONDS - started)) s"
}

# The text of <NAME>...</NAME> in a pom (a property), or nothing.
pom_property() {
  sed -n "s:.*<$2>\(.*\)</$2>.*:\1:p" "$1" | head -n 1
}
