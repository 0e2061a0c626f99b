#!/usr/bin/env bash
# kafka-harness.sh - run real Apache Kafka 4.x (KRaft, combined broker+controller)
# from Maven Central jars only: no release tarball, no Docker, no bin/*.sh.
#
#   kafka-harness.sh fetch [--force]        resolve jars into the cache (idempotent)
#   kafka-harness.sh cds                    make the class-data archives brokers and tools
#                                           start from (once per cache; optional, each
#                                           JVM start then loads Kafka's classes from
#                                           one mapped file: about 0.5 s less per start)
#   kafka-harness.sh start NAME PORT [--sasl] [--scram] [--acl] [--ssl] [--mtls]
#                          [--quorum static|dynamic] [--brokers N] [--prop key=value]... [--jvm-opt -Dkey=value]... (kept for restarts)
#                                           format + start one node on 127.0.0.1:PORT,
#                                           controller on PORT+1 (always PLAINTEXT);
#                                           waits until ready; prints bootstrap. On failure
#                                           prints the tail of the broker's logs, stops it,
#                                           exits 1.
#       --brokers N  N nodes (1-5), each broker and controller (a static quorum of N
#                voters): node K listens on PORT+2(K-1), its controller on PORT+2(K-1)+1;
#                with N >= 3 replication factor 3 and min.insync.replicas=2 by default
#                (N = 2: 2 and 1). Ready once every node answers and all N brokers are
#                registered. Each node's files are in RUN/NAME/node-K/.
#       --advertise-base P  clients are sent elsewhere (to a fault-injecting proxy the caller
#                runs, such as the testkit's): node K advertises its client listener as
#                127.0.0.1:P+2(K-1) and talks to the other brokers on a listener of its own,
#                INTERNAL on P+2(K-1)+1, so cutting clients off leaves replication alone.
#                PLAINTEXT only. env's BOOTSTRAP lists the INTERNAL listeners (the harness's
#                tools use them, never the proxies); ADVERTISED_BOOTSTRAP lists the proxies.
#       (none)   listener PLAINTEXT
#       --sasl   SASL/PLAIN, users $KAFKA_ADMIN_USER + $KAFKA_SASL_USERS
#       --scram  implies --sasl; also SCRAM-SHA-256 and SCRAM-SHA-512 (credentials for every
#                user created at format time; inter-broker stays PLAIN)
#       --acl    implies --sasl; StandardAuthorizer, super user admin, no ACL = deny
#       --ssl    listener SSL (SASL_SSL with --sasl/--scram/--acl); generates a throwaway CA,
#                a broker certificate (SAN IP:127.0.0.1, DNS:localhost) and a client
#                certificate under RUN/NAME/ssl/
#       --mtls   implies --ssl; ssl.client.auth=required (clients present ssl/client.p12)
#   kafka-harness.sh stop [--keep-data|--kill] NAME  stop broker/mm2 started under NAME
#                                           (--kill: SIGKILL and delete the data, for
#                                           clusters thrown away)
#   kafka-harness.sh restart NAME           stop + start again on the same data (and certs)
#   kafka-harness.sh stop-node NAME K [--kill]  stop node K of a cluster, keeping its data:
#                                           SIGTERM (controlled shutdown; leadership moves
#                                           away first) or, with --kill, SIGKILL (a crash)
#   kafka-harness.sh start-node NAME K      start node K again on its data; waits until ready
#                                           and every running node is registered
#   kafka-harness.sh stop-all               stop everything under the run root (mm2 first)
#   kafka-harness.sh status                 list NAMEs and whether they run
#   kafka-harness.sh tool CLASS|ALIAS args  run any Kafka main class; aliases: topics acls
#                                           configs console-producer console-consumer
#                                           consumer-groups producer-perf-test get-offsets
#                                           consumer-perf-test storage dump-log features
#                                           metadata-quorum transactions log-dirs ...
#   kafka-harness.sh mm2 [-d NAME] CONFIG [--clusters C...]
#                                           MirrorMaker 2 dedicated mode (fg, or -d bg)
#   kafka-harness.sh bootstrap NAME         print 127.0.0.1:PORT
#   kafka-harness.sh client-config NAME [USER]  print path of RUN/NAME/client[-USER].properties
#   kafka-harness.sh dir NAME | classpath [--mm2] | print-pom
#   kafka-harness.sh registry fetch | start NAME PORT | url NAME | pause NAME | resume NAME
#                                           a schema registry (Apicurio, Java 21+; registry.sh)
#   kafka-harness.sh serde fetch | produce ... | consume ...
#                                           Avro records through Confluent's serializers (serde.py)
#   kafka-harness.sh rdkafka-load ...       topics and records through librdkafka (rdkafka_load.py,
#                                           the same virtualenv): a non-Java client's shape
#
# Files of a cluster, in RUN/NAME (RUN = $KAFKA_HARNESS_RUN, default /tmp/kafka-harness-UID):
#   env                 KEY=VALUE lines, no quoting: NAME KAFKA_VERSION PORT CONTROLLER_PORT
#                       BOOTSTRAP (every node, comma-separated) BROKERS (N) NODE_K_PORT
#                       CLUSTER_ID SECURITY_PROTOCOL RUN_DIR LOG_DIR CLIENT_CONFIG
#                       SASL SCRAM ACL SSL MTLS (0/1); with SASL: SASL_MECHANISMS (comma list)
#                       ADMIN_USER ADMIN_PASSWORD SASL_USERS (user:password,...); with SSL:
#                       SSL_DIR SSL_CA_PEM SSL_CLIENT_CERT_PEM SSL_CLIENT_KEY_PEM (PKCS#8)
#                       SSL_KEYSTORE_P12 (client key+cert+CA) SSL_TRUSTSTORE_P12 (CA)
#                       SSL_STORE_PASSWORD SSL_KEY_PASSWORD SSL_CLIENT_AUTH (none|required)
#                       SSL_CLIENT_PRINCIPAL (User:CN=...) SSL_SERVER_NAME (localhost)
#   client.properties   Java client config: admin over SASL/PLAIN when SASL is on, else
#                       anonymous (PLAINTEXT/SSL; with --mtls it presents the client cert)
#   client-USER.properties          SASL/PLAIN as USER (admin alice bob mm2)
#   client-USER-scram256.properties SCRAM-SHA-256 as USER (--scram)
#   client-USER-scram512.properties SCRAM-SHA-512 as USER (--scram; = client-USER-scram)
#   client-nocert.properties        --mtls only: TLS without client certificate (must fail)
#   ssl/ ca.pem ca.key broker.pem broker.key broker.p12 client.pem client.key client.p12
#        truststore.p12 (all PKCS12 files and keys use SSL_STORE_PASSWORD)
#   server.properties cluster.id logs/{server,authorizer,stdout,format,ready-check}.log data/
#                       (with --brokers N > 1: server.properties, logs/, data/ and broker.pid of
#                       node K in node-K/; LOG_DIR is node-1's logs)
#
# MirrorMaker 2: connect-mirror is not published for every Kafka release (not for 4.4.0);
# fetch then resolves MM2 of the first of $KAFKA_MM2_VERSIONS that exists onto its own classpath
# (mm2-libs/); MM2 is only a client of the brokers, so an older MM2 is fine.
#
# Environment: KAFKA_VERSION (4.4.0), KAFKA_MM2_VERSIONS ("4.3.1 4.3.0 4.2.0 4.1.1"), JAVA_HOME,
# KAFKA_HARNESS_CACHE, KAFKA_HARNESS_RUN, KAFKA_HEAP (512m), KAFKA_MM2_HEAP (512m),
# KAFKA_HARNESS_BROKER_JVM (full; light: C1 and the serial collector), KAFKA_BROKER_OPTS, KAFKA_TOOL_OPTS,
# KAFKA_START_TIMEOUT (120 s), KAFKA_STOP_TIMEOUT (30 s),
# KAFKA_FAIL_TAIL (40 log lines shown on failure), KAFKA_ADMIN_USER/PASSWORD (admin/admin-secret),
# KAFKA_SASL_USERS ("alice:alice-secret bob:bob-secret mm2:mm2-secret"), KAFKA_SSL_PASSWORD
# (harness-secret), KAFKA_SSL_CLIENT_CN (kafka-harness-client), KAFKA_HARNESS_POM (use this pom
# instead of the built-in one), MAVEN_OFFLINE=1 (mvn -o), KAFKA_HARNESS_VERBOSE=1 (maven output),
# KAFKA_HARNESS_REQUEST_LOG=DEBUG (brokers log every request with its queue, local and remote
# times in server.log: where a broker spends a slow request's time; read when a broker starts),
# KAFKA_HARNESS_READY=log (a node is ready once it logs "Kafka Server started", without the
# admin round trips through Java tools; the testkit sets it).
# Needs java 17+, mvn (first fetch only), openssl + keytool (--ssl), python3 or unzip (fetch).
set -euo pipefail

# Why one file of this size: the testkit, the benchmark, the demo and CI call this script by
# path, and every subcommand shares the same run-directory layout, env file, classpath and pid
# bookkeeping (above, and the helpers below); one file keeps them from drifting apart. The
# parts that would move out next, into files it sources: the pom and fetch (print_pom to
# ensure_libs), and the certificates of --ssl (gen_ssl to client_ssl_lines).

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
HARNESS_CACHE="${KAFKA_HARNESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kafka-harness}"
RUN_ROOT="${KAFKA_HARNESS_RUN:-${TMPDIR:-/tmp}/kafka-harness-$(id -u)}"
WORK_DIR="$HARNESS_CACHE/kafka-$KAFKA_VERSION"
LIB_DIR="$WORK_DIR/libs"
MM2_LIB_DIR="$WORK_DIR/mm2-libs"   # only when connect-mirror $KAFKA_VERSION is not served
MM2_VERSIONS="${KAFKA_MM2_VERSIONS:-4.3.1 4.3.0 4.2.0 4.1.1}"
CONF_DIR="$HARNESS_CACHE/conf"
DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}"
STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
ADMIN_USER="${KAFKA_ADMIN_USER:-admin}"
ADMIN_PASS="${KAFKA_ADMIN_PASSWORD:-admin-secret}"
SASL_USERS="${KAFKA_SASL_USERS:-alice:alice-secret bob:bob-secret mm2:mm2-secret}"
SSL_PASS="${KAFKA_SSL_PASSWORD:-harness-secret}"   # every PKCS12 store and key of --ssl
SSL_CLIENT_CN="${KAFKA_SSL_CLIENT_CN:-kafka-harness-client}"
if [[ -n "${JAVA_HOME:-}" ]]; then JAVA="$JAVA_HOME/bin/java"; else JAVA="java"; fi

# Short-lived admin tools: small heap, C1 only (about half the CPU of a default JVM start).
LIGHT_OPTS=(-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true)
# Brokers of tests (KAFKA_HARNESS_BROKER_JVM=light, which the testkit sets): C1 only and the
# serial collector, about 40 % less CPU over a short test broker's life than the full JIT and G1
# (start, a little traffic, idle), for brokers that never run long enough to gain from C2.
BROKER_LIGHT_OPTS=(-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true)
# Clients whose speed matters (perf tests, console clients, MM2): full JIT.
HEAVY_OPTS=(-Xms128m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true)

log() { printf 'kafka-harness: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }

# ---------------------------------------------------------------- pom / fetch
print_pom() {
  cat <<'POM'
<?xml version="1.0" encoding="UTF-8"?>
<!-- Jars for a KRaft broker, the storage tool, the CLI tools and MirrorMaker 2.
     Use: mvn -q -f pom.xml org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies
              -DincludeScope=runtime -DoutputDirectory=libs [-Dkafka.version=4.4.0]
              [-DskipMirror=true (no MM2)] [-DmirrorOnly=true (MM2 + logging only)] -->
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 https://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.kafka-harness</groupId>
  <artifactId>kafka-harness-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>

  <properties>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
    <kafka.version>4.4.0</kafka.version>
    <!-- Kafka's POMs carry no logging backend (it is "releaseOnly" in Kafka's build),
         so we add log4j2 + the SLF4J 2 provider ourselves, one version for all log4j jars. -->
    <log4j.version>2.25.5</log4j.version>
    <slf4j.version>2.0.17</slf4j.version>
  </properties>

  <!-- logging: SLF4J 2 API (overrides Kafka's 1.7.36, which stays call-compatible)
       routed to log4j2; configured with -Dlog4j2.configurationFile=*.properties -->
  <dependencies>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>${slf4j.version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-api</artifactId>
      <version>${log4j.version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>${log4j.version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
      <version>${log4j.version}</version>
    </dependency>
  </dependencies>

  <profiles>
    <!-- Broker, storage tool and CLI tools. Active unless -DmirrorOnly is given
         (the MirrorMaker-only set that fetch falls back to for another Kafka version). -->
    <profile>
      <id>kafka</id>
      <activation>
        <property>
          <name>!mirrorOnly</name>
        </property>
      </activation>
      <dependencies>
        <!-- broker + controller (kafka.Kafka) and the storage tool (kafka.tools.StorageTool);
             pulls kafka-server, kafka-metadata, kafka-raft, kafka-storage, kafka-clients, scala -->
        <dependency>
          <groupId>org.apache.kafka</groupId>
          <artifactId>kafka_2.13</artifactId>
          <version>${kafka.version}</version>
        </dependency>
        <!-- CLI tools: org.apache.kafka.tools.* (topics, acls, console clients, perf tests, ...) -->
        <dependency>
          <groupId>org.apache.kafka</groupId>
          <artifactId>kafka-tools</artifactId>
          <version>${kafka.version}</version>
        </dependency>
        <!-- Connect runtime (kafka-tools already depends on it; named for clarity) -->
        <dependency>
          <groupId>org.apache.kafka</groupId>
          <artifactId>connect-runtime</artifactId>
          <version>${kafka.version}</version>
        </dependency>
      </dependencies>
    </profile>
    <!-- MirrorMaker 2 (org.apache.kafka.connect.mirror.MirrorMaker). Active unless
         -DskipMirror is given, so the rest still resolves if connect-mirror is not served
         (it is not, for 4.4.0: fetch then takes MM2 from an older release, see KAFKA_MM2_VERSIONS). -->
    <profile>
      <id>mirror</id>
      <activation>
        <property>
          <name>!skipMirror</name>
        </property>
      </activation>
      <dependencies>
        <dependency>
          <groupId>org.apache.kafka</groupId>
          <artifactId>connect-mirror</artifactId>
          <version>${kafka.version}</version>
        </dependency>
        <dependency>
          <groupId>org.apache.kafka</groupId>
          <artifactId>connect-mirror-client</artifactId>
          <version>${kafka.version}</version>
        </dependency>
      </dependencies>
    </profile>
  </profiles>

  <build>
    <pluginManagement>
      <plugins>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-dependency-plugin</artifactId>
          <version>3.8.1</version>
        </plugin>
      </plugins>
    </pluginManagement>
  </build>
</project>
POM
}

pom_text() {
  if [[ -n "${KAFKA_HARNESS_POM:-}" ]]; then cat "$KAFKA_HARNESS_POM"; else print_pom; fi
}

stamp_line() {
  printf 'kafka=%s pom=%s\n' "$KAFKA_VERSION" "$(pom_text | sha256sum | cut -c1-16)"
}

libs_ready() {
  [[ -f "$LIB_DIR/.complete" ]] && [[ "$(head -n1 "$LIB_DIR/.complete")" == "$(stamp_line)" ]]
}

# List the (top-level) classes of the given jars, one dotted name per line.
list_classes() {
  if command -v python3 >/dev/null 2>&1; then
    python3 - "$@" <<'PY'
import sys, zipfile
for jar in sys.argv[1:]:
    with zipfile.ZipFile(jar) as z:
        for n in z.namelist():
            if n.endswith('.class') and '$' not in n:
                print(n[:-6].replace('/', '.'))
PY
  else
    local jartool="jar"
    if [[ -n "${JAVA_HOME:-}" ]]; then jartool="$JAVA_HOME/bin/jar"; fi
    local j
    for j in "$@"; do
      if command -v unzip >/dev/null 2>&1; then unzip -Z1 "$j"; else "$jartool" tf "$j"; fi
    done | grep '\.class$' | grep -v '\$' | sed -e 's/\.class$//' -e 's#/#.#g'
  fi
}

cmd_fetch() {
  local force=""
  if [[ "${1:-}" == "--force" ]]; then force=1; fi
  if [[ -z "$force" ]] && libs_ready; then return 0; fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found (and $LIB_DIR is not populated)"
  mkdir -p "$WORK_DIR"
  # The lock lives on fd 9 of a subshell only, so no broker started later inherits it.
  # (Plain statement, not "( ... ) || ...": that would switch off set -e inside.)
  (
    if command -v flock >/dev/null 2>&1; then
      flock 9
      if [[ -z "$force" ]] && libs_ready; then exit 0; fi   # another process finished it
    fi
    fetch_locked
  ) 9>"$WORK_DIR/.fetch.lock"
}

# mvn_copy OUTDIR VERSION [-Dflags...]: copy the runtime dependency set of the pom into OUTDIR
mvn_copy() {
  local out="$1" ver="$2"; shift 2
  local -a args=(-B -f "$WORK_DIR/pom.xml" "-Dkafka.version=$ver"
                 "$DEP_PLUGIN:copy-dependencies" "-DoutputDirectory=$out" -DincludeScope=runtime "$@")
  if [[ -z "${KAFKA_HARNESS_VERBOSE:-}" ]]; then args=(-q "${args[@]}"); fi
  if [[ -n "${MAVEN_OFFLINE:-}" ]]; then args=(-o "${args[@]}"); fi
  rm -rf "$out"; mkdir -p "$out"
  if [[ -n "${MVN_LOG:-}" ]]; then
    if mvn "${args[@]}" >"$MVN_LOG" 2>&1; then return 0; fi
  elif mvn "${args[@]}"; then
    return 0
  fi
  rm -rf "$out"; return 1
}

fetch_locked() {
  pom_text >"$WORK_DIR/pom.xml"
  local tmp="$WORK_DIR/libs.tmp.$$" mtmp="$WORK_DIR/mm2-libs.tmp.$$"
  local mirror=yes
  log "resolving Apache Kafka $KAFKA_VERSION jars with Maven (first run downloads ~100 MB)"
  # First try: everything incl. connect-mirror $KAFKA_VERSION (its failure is expected for 4.4.0,
  # so its maven output goes to a file instead of the terminal).
  if ! MVN_LOG="$WORK_DIR/fetch-with-mirror.log" mvn_copy "$tmp" "$KAFKA_VERSION"; then
    log "connect-mirror $KAFKA_VERSION not resolvable ($(grep -m1 -o 'Could not find artifact [^ ]*' \
      "$WORK_DIR/fetch-with-mirror.log" || echo "see $WORK_DIR/fetch-with-mirror.log")); resolving broker and tools without it"
    mvn_copy "$tmp" "$KAFKA_VERSION" -DskipMirror=true || die "maven could not resolve Kafka $KAFKA_VERSION"
    mirror=no
    # MirrorMaker 2 from an older release, on its own classpath (MM2 is only a client of the brokers).
    local v
    for v in $MM2_VERSIONS; do
      [[ "$v" != "$KAFKA_VERSION" ]] || continue
      log "trying MirrorMaker 2 (connect-mirror) $v on a separate classpath"
      if mvn_copy "$mtmp" "$v" -DmirrorOnly=true && [[ -f "$mtmp/connect-mirror-$v.jar" ]]; then
        mirror="$v"; break
      fi
    done
    if [[ "$mirror" == no ]]; then log "WARNING: no connect-mirror in [$MM2_VERSIONS]: mm2 will be unavailable"; fi
  fi
  local need
  for need in "kafka_2.13-$KAFKA_VERSION.jar" "kafka-tools-$KAFKA_VERSION.jar" \
              "kafka-clients-$KAFKA_VERSION.jar" "log4j-core-*.jar" "log4j-slf4j2-impl-*.jar"; do
    if ! compgen -G "$tmp/$need" >/dev/null; then rm -rf "$tmp" "$mtmp"; die "resolved set lacks $need"; fi
  done
  if [[ $(compgen -G "$tmp/slf4j-api-*.jar" | wc -l) -ne 1 ]]; then log "WARNING: several slf4j-api jars in $tmp"; fi
  if compgen -G "$tmp/logback-classic-*.jar" >/dev/null; then log "WARNING: logback found; it competes with log4j2 for SLF4J"; fi
  local -a idx=()
  local j
  for j in "$tmp"/kafka*.jar "$tmp"/connect-*.jar; do
    if [[ -f "$j" ]]; then idx+=("$j"); fi
  done
  list_classes "${idx[@]}" | sort -u >"$tmp/.classes"
  rm -rf "$LIB_DIR" "$MM2_LIB_DIR"
  mv "$tmp" "$LIB_DIR"
  if [[ "$mirror" != yes && "$mirror" != no ]]; then mv "$mtmp" "$MM2_LIB_DIR"; fi
  rm -rf "$mtmp"
  { stamp_line; echo "mirror=$mirror"; } >"$LIB_DIR/.complete"
  log "$(find "$LIB_DIR" -name '*.jar' | wc -l) jars in $LIB_DIR; MirrorMaker 2: $(mm2_desc)"
}

mm2_mode() { sed -n 's/^mirror=//p' "$LIB_DIR/.complete" 2>/dev/null; }   # yes | no | VERSION

mm2_desc() {
  local m; m="$(mm2_mode)"
  case "$m" in
    yes) echo "$KAFKA_VERSION (in $LIB_DIR)" ;;
    no|"") echo "unavailable" ;;
    *) echo "$m ($(find "$MM2_LIB_DIR" -name '*.jar' | wc -l) jars in $MM2_LIB_DIR)" ;;
  esac
}

mm2_classpath() {  # prints the classpath dir of MirrorMaker 2 or dies
  local m; m="$(mm2_mode)"
  case "$m" in
    yes) echo "$LIB_DIR" ;;
    no|"") die "connect-mirror was resolvable neither for Kafka $KAFKA_VERSION nor for [$MM2_VERSIONS] (see 'fetch --force')" ;;
    *) [[ -d "$MM2_LIB_DIR" ]] || die "$MM2_LIB_DIR is missing (run 'fetch --force')"; echo "$MM2_LIB_DIR" ;;
  esac
}

ensure_libs() { if ! libs_ready; then cmd_fetch; fi; }

# ---------------------------------------------------------------- logging configs
write_atomic() {  # write_atomic FILE < content (safe when several harness calls race)
  local tmp; tmp="$(mktemp "$1.XXXXXX")"
  cat >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$1"
}

write_conf() {  # write_conf FILE < content: rewrite only when the content changed
  local new; new="$(cat)"
  if [[ ! -f "$1" || "$(cat "$1")" != "$new" ]]; then printf '%s\n' "$new" | write_atomic "$1"; fi
}

ensure_conf() {
  mkdir -p "$CONF_DIR"
  write_conf "$CONF_DIR/broker-log4j2.properties" <<'EOF'
status = warn
name = kafka-harness-broker
appender.server.type = File
appender.server.name = SERVER
appender.server.fileName = ${sys:kafka.logs.dir}/server.log
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
appender.authz.type = File
appender.authz.name = AUTHZ
appender.authz.fileName = ${sys:kafka.logs.dir}/authorizer.log
appender.authz.layout.type = PatternLayout
appender.authz.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.server.ref = SERVER
logger.request.name = kafka.request.logger
logger.request.level = ${env:KAFKA_HARNESS_REQUEST_LOG:-WARN}
logger.reqchan.name = kafka.network.RequestChannel$
logger.reqchan.level = WARN
logger.authz.name = kafka.authorizer.logger
logger.authz.level = INFO
logger.authz.additivity = false
logger.authz.appenderRef.authz.ref = AUTHZ
EOF
  write_conf "$CONF_DIR/tools-log4j2.properties" <<'EOF'
status = warn
name = kafka-harness-tools
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
  write_conf "$CONF_DIR/mm2-log4j2.properties" <<'EOF'
status = warn
name = kafka-harness-mm2
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.cfg.name = org.apache.kafka.common.config.AbstractConfig
logger.cfg.level = WARN
logger.isolation.name = org.apache.kafka.connect.runtime.isolation
logger.isolation.level = WARN
EOF
}

# ---------------------------------------------------------------- tools
# Candidates are tried in order; the first class present in the jars wins.
# (Several CLI classes moved from core/Scala to org.apache.kafka.tools during 3.x-4.4.)
alias_candidates() {
  case "$1" in
    topics)              echo "org.apache.kafka.tools.TopicCommand kafka.admin.TopicCommand" ;;
    console-producer)    echo "org.apache.kafka.tools.ConsoleProducer kafka.tools.ConsoleProducer" ;;
    console-consumer)    echo "org.apache.kafka.tools.consumer.ConsoleConsumer kafka.tools.ConsoleConsumer" ;;
    consumer-groups)     echo "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand kafka.admin.ConsumerGroupCommand" ;;
    acls)                echo "org.apache.kafka.tools.AclCommand kafka.admin.AclCommand" ;;
    configs)             echo "org.apache.kafka.tools.ConfigCommand kafka.admin.ConfigCommand" ;;
    producer-perf-test)  echo "org.apache.kafka.tools.ProducerPerformance" ;;
    consumer-perf-test)  echo "org.apache.kafka.tools.ConsumerPerformance kafka.tools.ConsumerPerformance" ;;
    get-offsets)         echo "org.apache.kafka.tools.GetOffsetShell kafka.tools.GetOffsetShell" ;;
    storage)             echo "org.apache.kafka.tools.StorageTool kafka.tools.StorageTool" ;;
    dump-log)            echo "org.apache.kafka.tools.DumpLogSegments kafka.tools.DumpLogSegments" ;;
    metadata-quorum)     echo "org.apache.kafka.tools.MetadataQuorumCommand" ;;
    features)            echo "org.apache.kafka.tools.FeatureCommand" ;;
    cluster)             echo "org.apache.kafka.tools.ClusterTool" ;;
    broker-api-versions) echo "org.apache.kafka.tools.BrokerApiVersionsCommand kafka.admin.BrokerApiVersionsCommand" ;;
    transactions)        echo "org.apache.kafka.tools.TransactionsCommand" ;;
    delete-records)      echo "org.apache.kafka.tools.DeleteRecordsCommand kafka.admin.DeleteRecordsCommand" ;;
    log-dirs)            echo "org.apache.kafka.tools.LogDirsCommand kafka.admin.LogDirsCommand" ;;
    leader-election)     echo "org.apache.kafka.tools.LeaderElectionCommand kafka.admin.LeaderElectionCommand" ;;
    reassign-partitions) echo "org.apache.kafka.tools.reassign.ReassignPartitionsCommand kafka.admin.ReassignPartitionsCommand" ;;
    groups)              echo "org.apache.kafka.tools.GroupsCommand" ;;
    e2e-latency)         echo "org.apache.kafka.tools.EndToEndLatency kafka.tools.EndToEndLatency" ;;
    verifiable-producer) echo "org.apache.kafka.tools.VerifiableProducer" ;;
    verifiable-consumer) echo "org.apache.kafka.tools.VerifiableConsumer" ;;
    mirror-maker)        echo "org.apache.kafka.connect.mirror.MirrorMaker" ;;
    *) return 1 ;;
  esac
}

resolve_class() {
  local cands c
  if ! cands="$(alias_candidates "$1")"; then echo "$1"; return 0; fi
  for c in $cands; do
    if [[ -f "$LIB_DIR/.classes" ]] && grep -Fxq "$c" "$LIB_DIR/.classes"; then echo "$c"; return 0; fi
  done
  echo "${cands%% *}"
}

is_heavy_alias() {
  case "$1" in
    console-producer|console-consumer|producer-perf-test|consumer-perf-test|e2e-latency|\
    verifiable-producer|verifiable-consumer|mirror-maker) return 0 ;;
    *.*) return 0 ;;   # an explicit class name: do not cripple the JIT
    *) return 1 ;;
  esac
}

# tool_cmd light|heavy CLASS ARGS...  -> fills the global array TOOL_CMD
tool_cmd() {
  local kind="$1" cls="$2"; shift 2
  local -a opts extra=()
  if [[ "$kind" == heavy ]]; then opts=("${HEAVY_OPTS[@]}"); else opts=("${LIGHT_OPTS[@]}"); fi
  if [[ -n "${KAFKA_TOOL_OPTS:-}" ]]; then read -r -a extra <<<"$KAFKA_TOOL_OPTS"; fi
  # The archive was made on the broker classpath: MM2's own classpath cannot use it.
  if [[ -z "${TOOL_CP:-}" ]]; then cds_opts tools; opts+=("${CDS_OPTS[@]}"); fi
  TOOL_CMD=("$JAVA" "${opts[@]}" "${extra[@]}" "-Dlog4j2.configurationFile=$CONF_DIR/tools-log4j2.properties"
            -cp "${TOOL_CP:-$LIB_DIR}/*" "$cls" "$@")
}

# ---------------------------------------------------------------- class-data archives
# AppCDS (JDK 13+ dynamic archives): a JVM started with -XX:SharedArchiveFile maps the classes
# an earlier run loaded instead of parsing them from the jars again. Brokers and tools start
# hundreds of times in the test suite; the archives are made once by `cds`. A JVM that cannot
# use an archive (another JDK build, another classpath) warns on stderr and starts as usual.
CDS_DIR="$WORK_DIR/cds"

cds_opts() {  # cds_opts broker|tools: fills CDS_OPTS (empty without an archive, or while making one)
  CDS_OPTS=()
  if [[ "$1" == broker && -n "${CDS_DUMP_BROKER:-}" ]]; then
    CDS_OPTS=("-XX:ArchiveClassesAtExit=$CDS_DUMP_BROKER")
  elif [[ -s "$CDS_DIR/$1.jsa" ]]; then
    # Unified JVM logging writes warnings to stdout by default; tools' stdout is their output.
    CDS_OPTS=("-XX:SharedArchiveFile=$CDS_DIR/$1.jsa" -Xshare:auto -Xlog:disable -Xlog:all=warning:stderr)
  fi
}

cmd_cds() {
  ensure_libs; ensure_conf
  if [[ -s "$CDS_DIR/broker.jsa" && -s "$CDS_DIR/tools.jsa" ]]; then return 0; fi
  mkdir -p "$CDS_DIR"
  (
    if command -v flock >/dev/null 2>&1; then
      flock 9
      if [[ -s "$CDS_DIR/broker.jsa" && -s "$CDS_DIR/tools.jsa" ]]; then exit 0; fi
    fi
    cds_make || { log "class-data archives not made (brokers and tools start without them)"; rm -f "$CDS_DIR"/*.tmp.*; }
  ) 9>"$CDS_DIR/.lock"
}

cds_make() {  # one broker started and stopped, one admin tool run against it, each dumping
  local port name="cds-$$" t0=$SECONDS
  for _ in $(seq 1 50); do
    # Below 32768, where Linux's ephemeral ports begin (the testkit's range is 20000-32767 too).
    port=$((20000 + RANDOM % 6000 * 2))
    if ! port_open "$port" && ! port_open $((port + 1)); then break; fi
  done
  local broker_tmp="$CDS_DIR/broker.jsa.tmp.$$" tools_tmp="$CDS_DIR/tools.jsa.tmp.$$"
  rm -f "$CDS_DIR"/*.jsa   # a dynamic archive is not made on top of another
  CDS_DUMP_BROKER="$broker_tmp" KAFKA_HARNESS_READY=log cmd_start "$name" "$port" >/dev/null || return 1
  tool_cmd light "$(resolve_class topics)" --bootstrap-server "127.0.0.1:$port" \
    --command-config "$RUN_ROOT/$name/client.properties" --create --topic cds --partitions 1
  TOOL_CMD=("${TOOL_CMD[0]}" "-XX:ArchiveClassesAtExit=$tools_tmp" "${TOOL_CMD[@]:1}")
  "${TOOL_CMD[@]}" >/dev/null 2>&1 || { cmd_stop --kill "$name"; rm -rf "${RUN_ROOT:?}/$name"; return 1; }
  cmd_stop "$name"   # SIGTERM: the JVM writes its archive as it exits
  rm -rf "${RUN_ROOT:?}/$name"
  [[ -s "$broker_tmp" && -s "$tools_tmp" ]] || return 1
  mv -f "$broker_tmp" "$CDS_DIR/broker.jsa"
  mv -f "$tools_tmp" "$CDS_DIR/tools.jsa"
  log "class-data archives made in $((SECONDS - t0))s ($CDS_DIR)"
}

run_tool() { tool_cmd "$@"; "${TOOL_CMD[@]}"; }

cmd_tool() {
  [[ $# -ge 1 ]] || die "usage: tool CLASS|ALIAS [args...]"
  ensure_libs; ensure_conf
  local name="$1"; shift
  local cls kind=light
  cls="$(resolve_class "$name")"
  if is_heavy_alias "$name"; then kind=heavy; fi
  if [[ "$cls" == org.apache.kafka.connect.mirror.* ]]; then TOOL_CP="$(mm2_classpath)"; fi
  tool_cmd "$kind" "$cls" "$@"
  exec "${TOOL_CMD[@]}"
}

# ---------------------------------------------------------------- brokers
check_name() { [[ "$1" =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad NAME '$1'"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

proc_running() {  # true if PID exists and is not a zombie (an un-reaped child looks alive to kill -0)
  kill -0 "$1" 2>/dev/null || return 1
  local st
  st="$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ "$st" != Z ]]
}

pid_alive_here() {  # pid_alive_here PIDFILE DIR: pid runs and was started by us for DIR
  local pid
  [[ -f "$1" ]] || return 1
  pid="$(cat "$1")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  proc_running "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-Dkafka.harness.dir=$2 "
}

gen_cluster_id() {  # like Uuid.randomUuid(): 16 random bytes, base64url, no padding, no '-'
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    if [[ ${#id} -eq 22 && "$id" != *-* ]]; then echo "$id"; return 0; fi
  done
}

jaas_plain() {  # server-side PLAIN JAAS: broker's own login + one user_NAME per account
  local s="org.apache.kafka.common.security.plain.PlainLoginModule required"
  s+=" username=\"$ADMIN_USER\" password=\"$ADMIN_PASS\" user_$ADMIN_USER=\"$ADMIN_PASS\""
  local up
  for up in $SASL_USERS; do s+=" user_${up%%:*}=\"${up#*:}\""; done
  echo "$s;"
}

# ---------------------------------------------------------------- TLS material
# gen_ssl SSLDIR NAME: a throwaway CA, a broker certificate for 127.0.0.1/localhost and a client
# certificate, as PEM (ca.pem, broker.pem/.key, client.pem/.key; keys unencrypted PKCS#8) and PKCS12
# (broker.p12 and client.p12 = key + cert + CA, truststore.p12 = CA only; password $SSL_PASS).
gen_ssl() {
  local d="$1" name="$2"
  command -v openssl >/dev/null 2>&1 || die "openssl not found (apt-get install -y openssl)"
  local kt=keytool
  if [[ -n "${JAVA_HOME:-}" ]]; then kt="$JAVA_HOME/bin/keytool"; fi
  command -v "$kt" >/dev/null 2>&1 || die "keytool not found (it comes with the JDK)"
  mkdir -p "$d"
  cat >"$d/openssl.cnf" <<CNF
[req]
distinguished_name = dn
prompt = no
[dn]
O = kafka-harness
CN = kafka-harness test CA ($name)
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[broker]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
CNF
  local pw="$SSL_PASS" who cn
  : >"$d/gen.log"
  ssl_run "$d" openssl req -x509 -config openssl.cnf -extensions ca -newkey rsa:2048 -nodes -sha256 \
    -days 3650 -keyout ca.key -out ca.pem
  for who in broker client; do
    cn="$SSL_CLIENT_CN"; if [[ "$who" == broker ]]; then cn=localhost; fi
    ssl_run "$d" openssl req -new -config openssl.cnf -newkey rsa:2048 -nodes -subj "/CN=$cn" \
      -keyout "$who.key" -out "$who.csr"
    ssl_run "$d" openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key \
      -set_serial "0x$(openssl rand -hex 12)" -days 3650 -sha256 \
      -extfile openssl.cnf -extensions "$who" -out "$who.pem"
    ssl_run "$d" openssl pkcs12 -export -name "$who" -in "$who.pem" -inkey "$who.key" -certfile ca.pem \
      -passout "pass:$pw" -out "$who.p12"
    rm -f "$d/$who.csr"
  done
  # a certificate-only PKCS12 that Java trusts needs keytool (OpenSSL 3.0 cannot mark the entry trusted)
  ssl_run "$d" "$kt" -J-XX:TieredStopAtLevel=1 -J-XX:+UseSerialGC -importcert -noprompt -alias ca \
    -file ca.pem -keystore truststore.p12 -storetype PKCS12 -storepass "$pw"
  chmod 600 "$d"/*.key
}

ssl_run() {  # ssl_run DIR CMD...: run CMD in DIR, output to DIR/gen.log; on failure show it and die
  local d="$1"; shift
  if ! (cd "$d" && "$@") >>"$d/gen.log" 2>&1; then
    tail -n 20 "$d/gen.log" >&2
    die "generating TLS material in $d failed: $*"
  fi
}

# ---------------------------------------------------------------- config files
# The write_* helpers read the cluster's settings from cmd_start's locals (bash dynamic scope):
# lsn (listener = security protocol), sasl, scram, acl, ssl, mtls, ssl_dir.
client_auth() { if [[ -n "$mtls" ]]; then echo required; else echo none; fi; }

client_ssl_lines() {  # client_ssl_lines [nocert]
  [[ -n "$ssl" ]] || return 0
  printf '%s\n' "ssl.truststore.type=PKCS12" "ssl.truststore.location=$ssl_dir/truststore.p12" \
    "ssl.truststore.password=$SSL_PASS" "ssl.endpoint.identification.algorithm=https"
  if [[ -n "$mtls" && "${1:-}" != nocert ]]; then
    printf '%s\n' "ssl.keystore.type=PKCS12" "ssl.keystore.location=$ssl_dir/client.p12" \
      "ssl.keystore.password=$SSL_PASS" "ssl.key.password=$SSL_PASS"
  fi
}

write_client_props() {  # write_client_props FILE [USER PASS MECH] (no USER: no SASL lines)
  {
    echo "security.protocol=$lsn"
    if [[ $# -ge 4 ]]; then
      local mod="org.apache.kafka.common.security.plain.PlainLoginModule"
      if [[ "$4" == SCRAM-* ]]; then mod="org.apache.kafka.common.security.scram.ScramLoginModule"; fi
      echo "sasl.mechanism=$4"
      echo "sasl.jaas.config=$mod required username=\"$2\" password=\"$3\";"
    fi
    client_ssl_lines
  } >"$1"
}

write_server_props() {  # dir port cport quorum node_id nodes voters extra...
  local dir="$1" port="$2" cport="$3" quorum="$4" node_id="$5" nodes="$6" voters="$7"
  shift 7
  local lc; lc="$(tr '[:upper:]' '[:lower:]' <<<"$lsn")"
  # Replication as a production cluster has it once there are 3 nodes (RF 3, min ISR 2): a
  # broker may fail without losing acknowledged writes, and acks=all needs 2 in sync.
  local rf=1 isr=1
  if ((nodes >= 3)); then rf=3 isr=2; elif ((nodes == 2)); then rf=2; fi
  {
    echo "# generated by kafka-harness.sh (Kafka $KAFKA_VERSION)"
    echo "process.roles=broker,controller"
    echo "node.id=$node_id"
    if [[ "$quorum" == dynamic ]]; then
      echo "controller.quorum.bootstrap.servers=127.0.0.1:$cport"
      echo "advertised.listeners=$lsn://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
    else
      echo "controller.quorum.voters=$voters"
      echo "advertised.listeners=$lsn://127.0.0.1:$port"
    fi
    echo "controller.listener.names=CONTROLLER"
    echo "listeners=$lsn://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
    echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,$lsn:$lsn"
    echo "inter.broker.listener.name=$lsn"
    echo "log.dirs=$dir/data"
    echo "num.partitions=1"
    echo "default.replication.factor=$rf"
    echo "min.insync.replicas=$isr"
    echo "offsets.topic.replication.factor=$rf"
    echo "offsets.topic.num.partitions=4"
    echo "transaction.state.log.replication.factor=$rf"
    echo "transaction.state.log.min.isr=$isr"
    echo "transaction.state.log.num.partitions=4"
    echo "share.coordinator.state.topic.replication.factor=$rf"
    echo "share.coordinator.state.topic.min.isr=$isr"
    echo "group.initial.rebalance.delay.ms=0"
    echo "auto.create.topics.enable=false"
    echo "log.cleaner.dedupe.buffer.size=33554432"
    if [[ -n "$sasl" ]]; then
      echo "sasl.enabled.mechanisms=PLAIN${scram:+,SCRAM-SHA-256,SCRAM-SHA-512}"
      echo "sasl.mechanism.inter.broker.protocol=PLAIN"
      echo "listener.name.$lc.plain.sasl.jaas.config=$(jaas_plain)"
      if [[ -n "$scram" ]]; then
        local m
        for m in scram-sha-256 scram-sha-512; do
          echo "listener.name.$lc.$m.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
        done
      fi
    fi
    if [[ -n "$ssl" ]]; then
      # used by the listener and by the broker's own (inter-broker) client
      echo "ssl.keystore.type=PKCS12"
      echo "ssl.keystore.location=$ssl_dir/broker.p12"
      echo "ssl.keystore.password=$SSL_PASS"
      echo "ssl.key.password=$SSL_PASS"
      echo "ssl.truststore.type=PKCS12"
      echo "ssl.truststore.location=$ssl_dir/truststore.p12"
      echo "ssl.truststore.password=$SSL_PASS"
      echo "ssl.endpoint.identification.algorithm=https"
      # listener-prefixed: an unprefixed ssl.client.auth is ignored on SASL_SSL listeners (KIP-684)
      echo "listener.name.$lc.ssl.client.auth=$(client_auth)"
    fi
    if [[ -n "$acl" ]]; then
      echo "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
      # ANONYMOUS = this node talking to its own PLAINTEXT controller listener.
      echo "super.users=User:$ADMIN_USER;User:ANONYMOUS"
      echo "allow.everyone.if.no.acl.found=false"
    fi
    local kv
    for kv in "$@"; do echo "$kv"; done   # --prop overrides: later keys win
  } >"$dir/server.properties"
}

write_env() {  # write_env DIR NAME PORT CPORT CLUSTER_ID NODES: KEY=VALUE lines (no quoting, no spaces)
  local dir="$1" nodes="$6" users="" up k bootstrap=""
  for up in $SASL_USERS; do users+="${users:+,}$up"; done
  for ((k = 1; k <= nodes; k++)); do bootstrap+="${bootstrap:+,}127.0.0.1:$(($3 + 2 * (k - 1)))"; done
  # With --advertise-base the harness's own tools use the INTERNAL listeners: a broker answers
  # with the addresses of the listener asked, so they never pass through the caller's proxies.
  if [[ -n "${abase:-}" ]]; then
    bootstrap=""
    for ((k = 1; k <= nodes; k++)); do bootstrap+="${bootstrap:+,}127.0.0.1:$((abase + 2 * (k - 1) + 1))"; done
  fi
  {
    echo "NAME=$2"
    echo "KAFKA_VERSION=$KAFKA_VERSION"
    echo "PORT=$3"
    echo "CONTROLLER_PORT=$4"
    echo "BOOTSTRAP=$bootstrap"
    echo "BROKERS=$nodes"
    for ((k = 1; k <= nodes; k++)); do echo "NODE_${k}_PORT=$(($3 + 2 * (k - 1)))"; done
    echo "CLUSTER_ID=$5"
    if [[ -n "${abase:-}" ]]; then
      local adv=""
      for ((k = 1; k <= nodes; k++)); do adv+="${adv:+,}127.0.0.1:$((abase + 2 * (k - 1)))"; done
      echo "ADVERTISED_BOOTSTRAP=$adv"
    fi
    echo "SECURITY_PROTOCOL=$lsn"
    echo "RUN_DIR=$dir"
    echo "LOG_DIR=$(node_dir "$dir" 1 "$nodes")/logs"
    echo "CLIENT_CONFIG=$dir/client.properties"
    echo "SASL=${sasl:-0}"
    echo "SCRAM=${scram:-0}"
    echo "ACL=${acl:-0}"
    echo "SSL=${ssl:-0}"
    echo "MTLS=${mtls:-0}"
    if [[ -n "$sasl" ]]; then
      echo "SASL_MECHANISMS=PLAIN${scram:+,SCRAM-SHA-256,SCRAM-SHA-512}"
      echo "ADMIN_USER=$ADMIN_USER"
      echo "ADMIN_PASSWORD=$ADMIN_PASS"
      echo "SASL_USERS=$users"
    fi
    if [[ -n "$ssl" ]]; then
      echo "SSL_DIR=$ssl_dir"
      echo "SSL_CA_PEM=$ssl_dir/ca.pem"
      echo "SSL_CLIENT_CERT_PEM=$ssl_dir/client.pem"
      echo "SSL_CLIENT_KEY_PEM=$ssl_dir/client.key"
      echo "SSL_KEYSTORE_P12=$ssl_dir/client.p12"
      echo "SSL_TRUSTSTORE_P12=$ssl_dir/truststore.p12"
      echo "SSL_STORE_PASSWORD=$SSL_PASS"
      echo "SSL_KEY_PASSWORD=$SSL_PASS"
      echo "SSL_CLIENT_AUTH=$(client_auth)"
      echo "SSL_CLIENT_PRINCIPAL=User:CN=$SSL_CLIENT_CN"
      echo "SSL_SERVER_NAME=localhost"
    fi
  } >"$dir/env"
}

launch_broker() {  # launch_broker DIR
  local dir="$1" pid
  local -a jvm=(-Xms128m "-Xmx${KAFKA_HEAP:-512m}") extra=()
  if [[ "${KAFKA_HARNESS_BROKER_JVM:-full}" == light ]]; then
    jvm+=("${BROKER_LIGHT_OPTS[@]}")
  else
    jvm+=(-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true)
  fi
  cds_opts broker
  jvm+=("${CDS_OPTS[@]}")
  if [[ -n "${KAFKA_BROKER_OPTS:-}" ]]; then read -r -a extra <<<"$KAFKA_BROKER_OPTS"; fi
  # --jvm-opt values given at start, kept for restarts (one per line)
  local cluster_dir opt f
  cluster_dir="$(dirname "$dir")"
  for f in "$dir/jvm-opts" "$cluster_dir/jvm-opts"; do
    if [[ -f "$f" ]]; then while IFS= read -r opt; do [[ -n "$opt" ]] && extra+=("$opt"); done <"$f"; break; fi
  done
  mkdir -p "$dir/logs"
  # keep the previous run's logs aside so readiness does not match a stale "started" line
  local f
  for f in server stdout ready-check; do
    if [[ -f "$dir/logs/$f.log" ]]; then mv -f "$dir/logs/$f.log" "$dir/logs/$f.log.1"; fi
  done
  nohup "$JAVA" "${jvm[@]}" "${extra[@]}" "-Dkafka.logs.dir=$dir/logs" \
    "-Dlog4j2.configurationFile=$CONF_DIR/broker-log4j2.properties" \
    "-Dkafka.harness.dir=$dir" -cp "$LIB_DIR/*" kafka.Kafka "$dir/server.properties" \
    >"$dir/logs/stdout.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/broker.pid"
}

broker_fail() {  # broker_fail DIR MESSAGE: print the tail of the broker's logs, stop it, die
  local dir="$1" n="${KAFKA_FAIL_TAIL:-40}" f; shift
  {
    for f in stdout.log server.log ready-check.log; do
      if [[ -s "$dir/logs/$f" ]]; then
        echo "----- last $n lines of $dir/logs/$f"
        tail -n "$n" "$dir/logs/$f"
      fi
    done
    if grep -qsE '^\[[^]]*\] (ERROR|FATAL)' "$dir/logs/server.log"; then
      echo "----- first errors in server.log"
      grep -m 3 -E '^\[[^]]*\] (ERROR|FATAL)' "$dir/logs/server.log" | cut -c1-400
    fi
    echo "-----"
  } >&2
  stop_pidfile "$dir/broker.pid" "$dir"
  die "$*"
}

node_dir() {  # node_dir CLUSTER_DIR K NODES: where node K's files live
  if (($3 > 1)); then echo "$1/node-$2"; else echo "$1"; fi
}

cluster_nodes() {  # cluster_nodes CLUSTER_DIR: N of --brokers N (1 for clusters started before it)
  local n; n="$(sed -n 's/^BROKERS=//p' "$1/env" 2>/dev/null)"
  echo "${n:-1}"
}

node_port() {  # node_port CLUSTER_DIR K
  local p; p="$(sed -n 's/^PORT=//p' "$1/env")"
  echo $((p + 2 * ($2 - 1)))
}

wait_registered() {  # wait_registered CLUSTER_DIR NODES: every broker registered and unfenced
  local dir="$1" nodes="$2" deadline=$((SECONDS + START_TIMEOUT)) n=0 left
  local bootstrap; bootstrap="$(sed -n 's/^BOOTSTRAP=//p' "$dir/env")"
  while :; do
    left=$((deadline - SECONDS))
    ((left > 5)) || left=5
    tool_cmd light "$(resolve_class broker-api-versions)" --bootstrap-server "$bootstrap" \
      --command-config "$dir/client.properties"
    if timeout "$left" "${TOOL_CMD[@]}" >"$dir/registered.log" 2>&1; then
      n="$(grep -cE '\(id: [0-9]+ ' "$dir/registered.log" || true)"
      if ((n >= nodes)) && ! grep -q 'isFenced: true' "$dir/registered.log"; then return 0; fi
    fi
    ((SECONDS < deadline)) || die "$(basename "$dir"): $n of $nodes brokers registered after ${START_TIMEOUT}s ($dir/registered.log)"
    sleep 1
  done
}

wait_ready() {  # wait_ready NODE_DIR PORT CLIENT_CONFIG
  local dir="$1" port="$2" client="$3" pid t0=$SECONDS name
  name="$(basename "$dir")"
  pid="$(cat "$dir/broker.pid")"
  local deadline=$((SECONDS + START_TIMEOUT))
  # 1) the process logs "Kafka Server started" (or at least the listener accepts). Kafka 4
  # logs it after the broker is unfenced and its listeners take requests, so with
  # KAFKA_HARNESS_READY=log (the testkit's setting) that line alone is the readiness: the Java
  # round trips below cost 2 to 5 s of CPU per node on a small machine.
  local quick=""
  if [[ "${KAFKA_HARNESS_READY:-}" == log ]]; then quick=1; fi
  until grep -qs 'Kafka Server started' "$dir/logs/server.log" || { [[ -z "$quick" ]] && port_open "$port"; }; do
    proc_running "$pid" || broker_fail "$dir" "broker $name exited during startup (logs in $dir/logs)"
    ((SECONDS < deadline)) || broker_fail "$dir" "broker $name not up after ${START_TIMEOUT}s (logs in $dir/logs)"
    sleep 0.2
  done
  if [[ -n "$quick" ]]; then
    log "$name ready on 127.0.0.1:$port in $((SECONDS - t0))s (logs: $dir/logs)"
    return 0
  fi
  # 2) a real admin round trip (Metadata via TopicCommand --list) succeeds
  local left
  while :; do
    left=$((deadline - SECONDS))
    ((left > 5)) || left=5
    tool_cmd light "$(resolve_class topics)" --bootstrap-server "127.0.0.1:$port" \
      --command-config "$client" --list
    if timeout "$left" "${TOOL_CMD[@]}" >"$dir/logs/ready-check.log" 2>&1; then break; fi
    proc_running "$pid" || broker_fail "$dir" "broker $name exited (logs in $dir/logs)"
    ((SECONDS < deadline)) || broker_fail "$dir" "broker $name did not answer admin requests within ${START_TIMEOUT}s"
    sleep 1
  done
  log "$name ready on 127.0.0.1:$port in $((SECONDS - t0))s (logs: $dir/logs)"
}

cmd_start() {
  [[ $# -ge 2 ]] || die "usage: start NAME PORT [--sasl] [--scram] [--acl] [--ssl] [--mtls] [--quorum static|dynamic] [--prop k=v]... [--jvm-opt -Dk=v]..."
  local name="$1" port="$2"; shift 2
  check_name "$name"
  if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1024 || port > 65534)); then die "bad PORT '$port'"; fi
  local sasl="" acl="" scram="" ssl="" mtls="" quorum=static nodes=1 abase=""
  local -a props=() jvm_opts=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --sasl) sasl=1 ;;
      --acl) acl=1; sasl=1 ;;          # ACLs are only meaningful with authenticated principals
      --scram) scram=1; sasl=1 ;;
      --ssl) ssl=1 ;;
      --mtls) mtls=1; ssl=1 ;;
      --quorum) [[ "${2:-}" =~ ^(static|dynamic)$ ]] || die "--quorum static|dynamic"; quorum="$2"; shift ;;
      --prop) [[ "${2:-}" == *=* ]] || die "--prop key=value"; props+=("$2"); shift ;;
      --jvm-opt) [[ "${2:-}" == -* ]] || die "--jvm-opt -Dkey=value"; jvm_opts+=("$2"); shift ;;
      --brokers) [[ "${2:-}" =~ ^[1-5]$ ]] || die "--brokers N (1 to 5), got '${2:-}'"; nodes="$2"; shift ;;
      --advertise-base) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--advertise-base PORT"; abase="$2"; shift ;;
      *) die "unknown option $1" ;;
    esac
    shift
  done
  if [[ "$quorum" == dynamic ]] && ((nodes > 1)); then die "--quorum dynamic takes one node (--brokers 1)"; fi
  if [[ -n "$abase" ]]; then
    [[ -z "$sasl$ssl" && "$quorum" == static ]] || die "--advertise-base takes a PLAINTEXT cluster with a static quorum"
    ((abase >= 1024 && abase + 2 * nodes - 1 <= 65535)) || die "bad --advertise-base '$abase'"
  fi
  if ((port + 2 * nodes - 1 > 65535)); then die "PORT $port leaves no room for $nodes nodes"; fi
  ensure_libs; ensure_conf
  local dir="$RUN_ROOT/$name" cport=$((port + 1)) k
  local ssl_dir="$dir/ssl"
  if cluster_running "$dir"; then die "$name is already running (stop it first)"; fi
  for ((k = 0; k < 2 * nodes; k++)); do
    if port_open $((port + k)); then die "port $((port + k)) is already in use"; fi
  done
  rm -rf "$dir"; mkdir -p "$dir/logs"
  if ((${#jvm_opts[@]})); then printf '%s\n' "${jvm_opts[@]}" >"$dir/jvm-opts"; fi
  local voters=""
  for ((k = 1; k <= nodes; k++)); do voters+="${voters:+,}$k@127.0.0.1:$((port + 2 * (k - 1) + 1))"; done
  local lsn=PLAINTEXT
  if [[ -n "$sasl" && -n "$ssl" ]]; then lsn=SASL_SSL
  elif [[ -n "$sasl" ]]; then lsn=SASL_PLAINTEXT
  elif [[ -n "$ssl" ]]; then lsn=SSL
  fi
  if [[ -n "$ssl" ]]; then gen_ssl "$ssl_dir" "$name"; fi
  local nd
  for ((k = 1; k <= nodes; k++)); do
    nd="$(node_dir "$dir" "$k" "$nodes")"
    mkdir -p "$nd/data" "$nd/logs"
    local -a node_props=()
    if [[ -n "$abase" ]]; then
      local ap=$((abase + 2 * (k - 1))) ip=$((abase + 2 * (k - 1) + 1))
      node_props=("listeners=PLAINTEXT://127.0.0.1:$((port + 2 * (k - 1))),INTERNAL://127.0.0.1:$ip,CONTROLLER://127.0.0.1:$((port + 2 * (k - 1) + 1))"
        "advertised.listeners=PLAINTEXT://127.0.0.1:$ap,INTERNAL://127.0.0.1:$ip"
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"
        "inter.broker.listener.name=INTERNAL")
    fi
    write_server_props "$nd" $((port + 2 * (k - 1))) $((port + 2 * (k - 1) + 1)) "$quorum" "$k" \
      "$nodes" "$voters" "${node_props[@]}" "${props[@]}"
  done
  # client configs: client.properties = admin (SASL) or anonymous/certificate (PLAINTEXT, SSL, mTLS);
  # with SASL also client-USER.properties (PLAIN) and, with --scram,
  # client-USER-scram256.properties / client-USER-scram512.properties (client-USER-scram = 512)
  if [[ -n "$sasl" ]]; then
    write_client_props "$dir/client.properties" "$ADMIN_USER" "$ADMIN_PASS" PLAIN
    local up u p
    for up in "$ADMIN_USER:$ADMIN_PASS" $SASL_USERS; do
      u="${up%%:*}" p="${up#*:}"
      write_client_props "$dir/client-$u.properties" "$u" "$p" PLAIN
      if [[ -n "$scram" ]]; then
        write_client_props "$dir/client-$u-scram256.properties" "$u" "$p" SCRAM-SHA-256
        write_client_props "$dir/client-$u-scram512.properties" "$u" "$p" SCRAM-SHA-512
        cp "$dir/client-$u-scram512.properties" "$dir/client-$u-scram.properties"
      fi
    done
  else
    write_client_props "$dir/client.properties"
  fi
  if [[ -n "$mtls" ]]; then   # for negative tests: TLS without a client certificate
    { grep -v '^ssl\.' "$dir/client.properties"; client_ssl_lines nocert; } >"$dir/client-nocert.properties"
  fi
  local cid; cid="$(gen_cluster_id)"
  echo "$cid" >"$dir/cluster.id"
  write_env "$dir" "$name" "$port" "$cport" "$cid" "$nodes"
  # format storage (static quorum: no --standalone; dynamic quorum: --standalone)
  local -a fmt=(format --cluster-id "$cid")
  if [[ "$quorum" == dynamic ]]; then fmt+=(--standalone); fi
  if [[ -n "$scram" ]]; then
    local up m
    for up in "$ADMIN_USER:$ADMIN_PASS" $SASL_USERS; do
      for m in SCRAM-SHA-256 SCRAM-SHA-512; do
        fmt+=(--add-scram "$m=[name=${up%%:*},password=${up#*:}]")
      done
    done
  fi
  # Every node's format at once: each is a JVM start of 1.5 to 2 s.
  local -a formats=()
  for ((k = 1; k <= nodes; k++)); do
    nd="$(node_dir "$dir" "$k" "$nodes")"
    run_tool light "$(resolve_class storage)" "${fmt[@]}" --config "$nd/server.properties" \
      >"$nd/logs/format.log" 2>&1 &
    formats+=($!)
  done
  for ((k = 1; k <= nodes; k++)); do
    nd="$(node_dir "$dir" "$k" "$nodes")"
    if ! wait "${formats[k - 1]}"; then
      cat "$nd/logs/format.log" >&2
      die "storage format failed for $name (node $k)"
    fi
  done
  start_nodes "$dir" "$nodes"
  sed -n 's/^BOOTSTRAP=//p' "$dir/env"
}

start_nodes() {  # start_nodes CLUSTER_DIR NODES: launch every node, then wait for all of them
  local dir="$1" nodes="$2" k
  # All at once: with a quorum of N voters no node can finish starting alone.
  for ((k = 1; k <= nodes; k++)); do launch_broker "$(node_dir "$dir" "$k" "$nodes")"; done
  for ((k = 1; k <= nodes; k++)); do
    wait_ready "$(node_dir "$dir" "$k" "$nodes")" "$(node_port "$dir" "$k")" "$dir/client.properties"
  done
  if ((nodes > 1)) && [[ "${KAFKA_HARNESS_READY:-}" != log ]]; then wait_registered "$dir" "$nodes"; fi
}

cluster_running() {  # cluster_running CLUSTER_DIR: any node of it runs
  local f
  for f in "$1"/broker.pid "$1"/node-*/broker.pid; do
    if [[ -e "$f" ]] && pid_alive_here "$f" "$(dirname "$f")"; then return 0; fi
  done
  return 1
}

node_arg() {  # node_arg NAME K: the node's directory, or die naming what is wrong
  local dir="$RUN_ROOT/$1" nodes
  [[ -f "$dir/env" ]] || die "$1 was never started"
  nodes="$(cluster_nodes "$dir")"
  [[ "$2" =~ ^[0-9]+$ ]] && (($2 >= 1 && $2 <= nodes)) || die "$1 has nodes 1 to $nodes, not '$2'"
  node_dir "$dir" "$2" "$nodes"
}

cmd_stop_node() {
  [[ $# -ge 2 && $# -le 3 ]] || die "usage: stop-node NAME K [--kill]"
  check_name "$1"
  local nd; nd="$(node_arg "$1" "$2")"
  if [[ "${3:-}" == --kill ]]; then
    kill_pidfile "$nd/broker.pid" "$nd"
  elif [[ -n "${3:-}" ]]; then
    die "stop-node: unknown option $3"
  else
    stop_pidfile "$nd/broker.pid" "$nd"
  fi
  log "$1 node $2 stopped${3:+ (killed)}"
}

cmd_start_node() {
  [[ $# -eq 2 ]] || die "usage: start-node NAME K"
  check_name "$1"
  local nd dir="$RUN_ROOT/$1"; nd="$(node_arg "$1" "$2")"
  if pid_alive_here "$nd/broker.pid" "$nd"; then die "$1 node $2 is already running"; fi
  [[ -f "$nd/data/meta.properties" ]] || die "$1 node $2 has no formatted data; use start"
  ensure_libs; ensure_conf
  launch_broker "$nd"
  wait_ready "$nd" "$(node_port "$dir" "$2")" "$dir/client.properties"
  local nodes; nodes="$(cluster_nodes "$dir")"
  # Only the nodes running now: a test may start one while another is still down (an unclean
  # leader election needs exactly that).
  if ((nodes > 1)); then wait_registered "$dir" "$(running_nodes "$dir" "$nodes")"; fi
}

running_nodes() {  # running_nodes CLUSTER_DIR NODES: how many of the nodes run
  local k n=0 nd
  for ((k = 1; k <= $2; k++)); do
    nd="$(node_dir "$1" "$k" "$2")"
    if pid_alive_here "$nd/broker.pid" "$nd"; then n=$((n + 1)); fi
  done
  echo "$n"
}

cmd_restart() {
  [[ $# -eq 1 ]] || die "usage: restart NAME"
  check_name "$1"
  local dir="$RUN_ROOT/$1"
  [[ -f "$dir/env" ]] || die "$1 was never started"
  local nodes k nd; nodes="$(cluster_nodes "$dir")"
  for ((k = 1; k <= nodes; k++)); do
    nd="$(node_dir "$dir" "$k" "$nodes")"
    [[ -f "$nd/server.properties" ]] || die "$1 was never started"
    stop_pidfile "$nd/broker.pid" "$nd"
  done
  for ((k = 1; k <= nodes; k++)); do
    nd="$(node_dir "$dir" "$k" "$nodes")"
    [[ -f "$nd/data/meta.properties" ]] || die "$1 has no formatted data (stopped without --keep-data?); use start"
  done
  ensure_libs; ensure_conf
  start_nodes "$dir" "$nodes"
  sed -n 's/^BOOTSTRAP=//p' "$dir/env"
}

stop_pidfile() {  # stop_pidfile PIDFILE DIR  (SIGTERM, then SIGKILL after STOP_TIMEOUT)
  local f="$1" dir="$2" pid
  [[ -f "$f" ]] || return 0
  if pid_alive_here "$f" "$dir"; then
    pid="$(cat "$f")"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while proc_running "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
    if proc_running "$pid"; then
      log "$(basename "$f" .pid) of $(basename "$dir") ignored SIGTERM; killing"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$f"
}

kill_pidfile() {  # kill_pidfile PIDFILE DIR  (SIGKILL, a crash; waits until it is gone)
  local f="$1" dir="$2" pid
  if pid_alive_here "$f" "$dir"; then
    pid="$(cat "$f")"
    kill -KILL "$pid" 2>/dev/null || true
    while proc_running "$pid"; do sleep 0.05; done
  fi
  rm -f "$f"
}

cmd_stop() {
  local keep=""
  if [[ "${1:-}" == "--keep-data" ]]; then keep=1; shift; fi
  if [[ "${1:-}" == "--kill" ]]; then
    # Data about to be deleted needs no controlled shutdown (2 to 6 s per cluster).
    shift
    [[ $# -eq 1 ]] || die "usage: stop --kill NAME"
    check_name "$1"
    local dir="$RUN_ROOT/$1" f
    [[ -d "$dir" ]] || return 0
    for f in "$dir"/*.pid "$dir"/node-*/broker.pid; do
      [[ -e "$f" ]] && kill_pidfile "$f" "$(dirname "$f")"
    done
    rm -rf "$dir/data" "$dir"/node-*/data
    return 0
  fi
  [[ $# -eq 1 ]] || die "usage: stop [--keep-data|--kill] NAME"
  check_name "$1"
  local dir="$RUN_ROOT/$1" f
  [[ -d "$dir" ]] || return 0
  # Clients (mm2.pid) first, then every node; nodes stop in parallel so a quorum that loses
  # its majority does not make the last ones wait for their controlled shutdown.
  for f in "$dir"/*.pid; do
    if [[ -e "$f" && "$(basename "$f")" != broker.pid ]]; then stop_pidfile "$f" "$dir"; fi
  done
  local -a waits=()
  for f in "$dir"/broker.pid "$dir"/node-*/broker.pid; do
    if [[ -e "$f" ]]; then stop_pidfile "$f" "$(dirname "$f")" & waits+=($!); fi
  done
  if ((${#waits[@]})); then wait "${waits[@]}" || true; fi
  if [[ -z "$keep" ]]; then rm -rf "$dir/data" "$dir"/node-*/data; fi
}

cmd_stop_all() {
  local d f
  [[ -d "$RUN_ROOT" ]] || return 0
  # clients first (MM2 shuts down slowly, up to the SIGKILL timeout, once its brokers are gone)
  for f in "$RUN_ROOT"/*/*.pid; do
    if [[ -e "$f" && "$(basename "$f")" != broker.pid ]]; then stop_pidfile "$f" "$(dirname "$f")"; fi
  done
  for d in "$RUN_ROOT"/*/; do
    if [[ -d "$d" ]]; then cmd_stop "$(basename "$d")"; fi
  done
}

cmd_status() {
  local d f state
  [[ -d "$RUN_ROOT" ]] || return 0
  for d in "$RUN_ROOT"/*/; do
    [[ -d "$d" ]] || continue
    d="${d%/}"; state="stopped"
    for f in "$d"/*.pid "$d"/node-*/broker.pid; do
      if [[ -e "$f" ]] && pid_alive_here "$f" "$(dirname "$f")"; then state="running($(basename "$f" .pid) pid $(cat "$f"))"; fi
    done
    printf '%-20s %-32s %s\n' "$(basename "$d")" "$state" "$(sed -n 's/^BOOTSTRAP=//p; s/^REGISTRY_URL=//p' "$d/env" 2>/dev/null)"
  done
}

# ---------------------------------------------------------------- MirrorMaker 2
cmd_mm2() {
  local name=""
  if [[ "${1:-}" == "-d" ]]; then name="${2:-}"; check_name "$name"; shift 2; fi
  [[ $# -ge 1 && -f "$1" ]] || die "usage: mm2 [-d NAME] CONFIG.properties [--clusters C...]"
  local cfg; cfg="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; shift
  ensure_libs; ensure_conf
  local cp; cp="$(mm2_classpath)"
  local -a jvm=(-Xms128m "-Xmx${KAFKA_MM2_HEAP:-512m}" -XX:+UseG1GC -Djava.awt.headless=true
                "-Dlog4j2.configurationFile=$CONF_DIR/mm2-log4j2.properties")
  local cls=org.apache.kafka.connect.mirror.MirrorMaker
  if [[ -z "$name" ]]; then
    exec "$JAVA" "${jvm[@]}" -cp "$cp/*" "$cls" "$cfg" "$@"
  fi
  local dir="$RUN_ROOT/$name" pid
  if pid_alive_here "$dir/mm2.pid" "$dir"; then die "mm2 $name is already running"; fi
  mkdir -p "$dir/logs"
  nohup "$JAVA" "${jvm[@]}" "-Dkafka.harness.dir=$dir" -cp "$cp/*" "$cls" "$cfg" "$@" \
    >"$dir/logs/mm2.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/mm2.pid"
  local deadline=$((SECONDS + START_TIMEOUT))
  until grep -qs 'Kafka MirrorMaker started' "$dir/logs/mm2.log"; do
    proc_running "$pid" || { tail -n 60 "$dir/logs/mm2.log" >&2; die "mm2 $name exited"; }
    ((SECONDS < deadline)) || die "mm2 $name not started after ${START_TIMEOUT}s ($dir/logs/mm2.log)"
    sleep 0.5
  done
  log "mm2 $name started (pid $pid, log $dir/logs/mm2.log); connectors start shortly after"
}

# ---------------------------------------------------------------- schema registries
# shellcheck source=registry.sh
source "$(dirname "${BASH_SOURCE[0]}")/registry.sh"

# ---------------------------------------------------------------- main
main() {
  [[ $# -ge 1 ]] || usage
  local cmd="$1"; shift
  case "$cmd" in
    fetch) cmd_fetch "$@" ;;
    cds) cmd_cds ;;
    start) cmd_start "$@" ;;
    restart) cmd_restart "$@" ;;
    stop-node) cmd_stop_node "$@" ;;
    start-node) cmd_start_node "$@" ;;
    stop) cmd_stop "$@" ;;
    stop-all) cmd_stop_all ;;
    status) cmd_status ;;
    tool) cmd_tool "$@" ;;
    mm2) cmd_mm2 "$@" ;;
    registry) cmd_registry "$@" ;;
    serde) cmd_serde "$@" ;;
    rdkafka-load) cmd_rdkafka_load "$@" ;;
    bootstrap) check_name "${1:?NAME}"; sed -n 's/^BOOTSTRAP=//p' "$RUN_ROOT/$1/env" ;;
    client-config)
      check_name "${1:?NAME}"
      if [[ -n "${2:-}" ]]; then echo "$RUN_ROOT/$1/client-$2.properties"; else echo "$RUN_ROOT/$1/client.properties"; fi ;;
    dir) check_name "${1:?NAME}"; echo "$RUN_ROOT/$1" ;;
    classpath)
      ensure_libs
      if [[ "${1:-}" == --mm2 ]]; then echo "$(mm2_classpath)/*"; else echo "$LIB_DIR/*"; fi ;;
    print-pom) print_pom ;;
    -h|--help|help) usage ;;
    *) die "unknown command '$cmd' (try --help)" ;;
  esac
}

main "$@"
