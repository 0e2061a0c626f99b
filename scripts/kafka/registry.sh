# Sourced by kafka-harness.sh: schema registries for tests. Apicurio Registry from Maven Central
# (io.apicurio:apicurio-registry-app, classifier all, a Quarkus application as a tar.gz), run
# with `java -jar quarkus-run.jar`, in memory, bound to 127.0.0.1. kmirror speaks only the
# Confluent Schema Registry API, which Apicurio serves at /apis/ccompat/v7.
#
#   registry fetch              download and unpack it once into the cache (~160 MB)
#   registry start NAME PORT    start one on PORT (and PORT+1, its management interface);
#                               ready once the Confluent API answers
#   registry url NAME           its Confluent API base URL
#   registry pause|resume NAME  SIGSTOP / SIGCONT (an in-memory registry loses all on restart)
#   stop NAME, stop-all         stop it as they stop brokers
#   serde fetch|produce|consume Avro records through Confluent's serializers (serde.py), its
#                               Python client from PyPI in a virtualenv in the cache
#
# Apicurio 3 needs Java 21 or newer: APICURIO_JAVA_HOME, else JAVA_HOME, else a JDK under
# /usr/lib/jvm, else java on PATH, whichever is 21+ first. Environment: APICURIO_VERSION
# (3.3.3), APICURIO_HEAP (384m).

APICURIO_VERSION="${APICURIO_VERSION:-3.3.3}"
REGISTRY_HOME="$HARNESS_CACHE/apicurio-$APICURIO_VERSION"

registry_ready() { [[ -f "$REGISTRY_HOME/.complete" && -f "$REGISTRY_HOME/quarkus-run.jar" ]]; }

java_major() {  # java_major JAVA: its feature version, or 0
  "$1" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p' | head -n1 || true
}

registry_java() {  # prints a java of version 21 or newer, or dies naming where it looked
  local c m
  local -a candidates=()
  [[ -n "${APICURIO_JAVA_HOME:-}" ]] && candidates+=("$APICURIO_JAVA_HOME/bin/java")
  [[ -n "${JAVA_HOME:-}" ]] && candidates+=("$JAVA_HOME/bin/java")
  for c in /usr/lib/jvm/*/bin/java; do [[ -x "$c" ]] && candidates+=("$c"); done
  command -v java >/dev/null 2>&1 && candidates+=("$(command -v java)")
  for c in "${candidates[@]}"; do
    [[ -x "$c" ]] || continue
    m="$(java_major "$c")"
    if [[ "${m:-0}" =~ ^[0-9]+$ ]] && ((m >= 21)); then echo "$c"; return 0; fi
  done
  die "Apicurio Registry $APICURIO_VERSION needs Java 21 or newer; none found (looked at APICURIO_JAVA_HOME, JAVA_HOME, /usr/lib/jvm/*, java on PATH: ${candidates[*]:-nothing}). Install one (apt-get install -y openjdk-21-jdk-headless) or set APICURIO_JAVA_HOME."
}

cmd_registry_fetch() {
  registry_ready && return 0
  command -v mvn >/dev/null 2>&1 || die "mvn not found (and $REGISTRY_HOME is not populated)"
  mkdir -p "$HARNESS_CACHE"
  (
    if command -v flock >/dev/null 2>&1; then
      flock 9
      registry_ready && exit 0   # another process finished it
    fi
    local tmp="$REGISTRY_HOME.tmp.$$"
    rm -rf "$tmp"; mkdir -p "$tmp"
    log "fetching Apicurio Registry $APICURIO_VERSION with Maven (~160 MB, once)"
    local -a args=(-B "$DEP_PLUGIN:copy"
      "-Dartifact=io.apicurio:apicurio-registry-app:$APICURIO_VERSION:tar.gz:all" "-DoutputDirectory=$tmp")
    if [[ -z "${KAFKA_HARNESS_VERBOSE:-}" ]]; then args=(-q "${args[@]}"); fi
    if [[ -n "${MAVEN_OFFLINE:-}" ]]; then args=(-o "${args[@]}"); fi
    # Run where no pom is: the copy goal needs none.
    (cd "$tmp" && mvn "${args[@]}") || { rm -rf "$tmp"; die "maven could not fetch io.apicurio:apicurio-registry-app:$APICURIO_VERSION (tar.gz, classifier all)"; }
    tar xzf "$tmp/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz" -C "$tmp" || { rm -rf "$tmp"; die "could not unpack the Apicurio Registry archive"; }
    rm -f "$tmp/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz"
    [[ -f "$tmp/quarkus-run.jar" ]] || { rm -rf "$tmp"; die "the Apicurio Registry archive has no quarkus-run.jar"; }
    echo "apicurio=$APICURIO_VERSION" >"$tmp/.complete"
    rm -rf "$REGISTRY_HOME"
    mv "$tmp" "$REGISTRY_HOME"
    log "Apicurio Registry $APICURIO_VERSION in $REGISTRY_HOME"
  ) 9>"$HARNESS_CACHE/.registry-fetch.lock"
}

http_ok() {  # http_ok PORT PATH: the answer's status is 200 (plain bash: no curl needed)
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
    local status
    IFS= read -r -t 5 status <&3 || exit 1
    [[ "$status" == *" 200 "* ]]
  ) 2>/dev/null
}

registry_start() {
  [[ $# -eq 2 ]] || die "usage: registry start NAME PORT"
  local name="$1" port="$2"
  check_name "$name"
  [[ "$port" =~ ^[0-9]+$ ]] || die "bad PORT '$port'"
  local dir="$RUN_ROOT/$name"
  if pid_alive_here "$dir/registry.pid" "$dir"; then die "registry $name is already running"; fi
  cmd_registry_fetch
  local java; java="$(registry_java)"
  local p
  for p in "$port" $((port + 1)); do
    if port_open "$p"; then die "port $p is in use (registry $name needs $port and $((port + 1)))"; fi
  done
  mkdir -p "$dir/logs"
  local url="http://127.0.0.1:$port/apis/ccompat/v7"
  printf 'REGISTRY_URL=%s\nPORT=%s\n' "$url" "$port" >"$dir/env"
  # C1 and the serial collector, as the tests' brokers: a test registry lives for minutes.
  (
    cd "$dir"
    export QUARKUS_HTTP_HOST=127.0.0.1 QUARKUS_HTTP_PORT="$port"
    export QUARKUS_MANAGEMENT_HOST=127.0.0.1 QUARKUS_MANAGEMENT_PORT=$((port + 1))
    nohup "$java" "-Xmx${APICURIO_HEAP:-384m}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -Djava.awt.headless=true "-Dkafka.harness.dir=$dir" -jar "$REGISTRY_HOME/quarkus-run.jar" \
      >"$dir/logs/registry.log" 2>&1 </dev/null &
    echo $! >"$dir/registry.pid"
  )
  local pid; pid="$(cat "$dir/registry.pid")"
  local deadline=$((SECONDS + START_TIMEOUT))
  until http_ok "$port" /apis/ccompat/v7/subjects; do
    proc_running "$pid" || { tail -n "${KAFKA_FAIL_TAIL:-40}" "$dir/logs/registry.log" >&2; die "registry $name exited while starting"; }
    ((SECONDS < deadline)) || { tail -n "${KAFKA_FAIL_TAIL:-40}" "$dir/logs/registry.log" >&2; die "registry $name not ready after ${START_TIMEOUT}s"; }
    sleep 0.25
  done
  log "registry $name ready at $url (Apicurio $APICURIO_VERSION, Java $(java_major "$java"), pid $pid)"
}

registry_signal() {  # registry_signal NAME SIGNAL
  check_name "$1"
  local dir="$RUN_ROOT/$1"
  pid_alive_here "$dir/registry.pid" "$dir" || die "registry $1 is not running"
  kill "-$2" "$(cat "$dir/registry.pid")"
}

cmd_registry() {
  [[ $# -ge 1 ]] || die "usage: registry fetch|start|url|pause|resume ..."
  local sub="$1"; shift
  case "$sub" in
    fetch) cmd_registry_fetch ;;
    start) registry_start "$@" ;;
    url) check_name "${1:?NAME}"; sed -n 's/^REGISTRY_URL=//p' "$RUN_ROOT/$1/env" ;;
    pause) registry_signal "${1:?NAME}" STOP ;;
    resume) registry_signal "${1:?NAME}" CONT ;;
    *) die "unknown registry command '$sub' (fetch, start, url, pause, resume)" ;;
  esac
}

# ---------------------------------------------------------------- real serializers
# serde ARGS...: scripts/kafka/serde.py (Confluent's Python client and its Avro, Protobuf and JSON
# Schema serializers, grpcio-tools to compile .proto files, from PyPI) in a virtualenv kept in the
# cache, made once. KAFKA_HARNESS_SERDE_CLIENT: the pip requirements, space-separated.
SERDE_CLIENT="${KAFKA_HARNESS_SERDE_CLIENT:-confluent-kafka[avro,json,protobuf,schemaregistry]==2.16.1 grpcio-tools==1.85.4}"
SERDE_VENV="$HARNESS_CACHE/serde-venv"

serde_ready() { [[ -f "$SERDE_VENV/.complete" && "$(cat "$SERDE_VENV/.complete")" == "$SERDE_CLIENT" ]]; }

cmd_serde_fetch() {
  serde_ready && return 0
  command -v python3 >/dev/null 2>&1 || die "python3 not found (the serializers run on it)"
  mkdir -p "$HARNESS_CACHE"
  (
    if command -v flock >/dev/null 2>&1; then
      flock 9
      serde_ready && exit 0
    fi
    # Made in place (a virtualenv's scripts name its path), complete once .complete is written.
    rm -rf "$SERDE_VENV"
    log "installing $SERDE_CLIENT from PyPI into $SERDE_VENV (once)"
    python3 -m venv "$SERDE_VENV" || { rm -rf "$SERDE_VENV"; die "python3 -m venv failed (apt-get install -y python3-venv)"; }
    # shellcheck disable=SC2086 # one requirement per word
    "$SERDE_VENV/bin/python" -m pip install -q --disable-pip-version-check $SERDE_CLIENT ||
      { rm -rf "$SERDE_VENV"; die "pip could not install $SERDE_CLIENT"; }
    echo "$SERDE_CLIENT" >"$SERDE_VENV/.complete"
  ) 9>"$HARNESS_CACHE/.serde-fetch.lock"
}

cmd_serde() {
  if [[ "${1:-}" == fetch ]]; then cmd_serde_fetch; return; fi
  cmd_serde_fetch
  exec "$SERDE_VENV/bin/python" "$(dirname "${BASH_SOURCE[0]}")/serde.py" "$@"
}

# rdkafka-load ARGS...: scripts/kafka/rdkafka_load.py in the serializers' virtualenv (librdkafka
# comes with confluent-kafka's wheel).
cmd_rdkafka_load() {
  cmd_serde_fetch
  exec "$SERDE_VENV/bin/python" "$(dirname "${BASH_SOURCE[0]}")/rdkafka_load.py" "$@"
}
