#!/usr/bin/env bash
# End-to-end check of kafka-harness.sh against real brokers (needs Maven Central once, for fetch).
#  1. src (PLAINTEXT) and dst (SASL_PLAINTEXT: PLAIN + SCRAM-SHA-256/512, StandardAuthorizer),
#     started in parallel: perf tool, console round trips (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512),
#     ACL enforcement, MirrorMaker 2 (dedicated mode) src -> dst with content check.
#  2. one after the other: SSL, mTLS (ssl.client.auth=required), SASL_SSL (+SCRAM, ACL): console round
#     trips with the generated PKCS12 client configs, restart of the SSL cluster, and (when installed)
#     openssl s_client / kcat using the PEM and client.p12 files meant for non-JVM clients.
#  3. stop-all leaves no JVM of this run behind.
# Everything runs under its own run root (KAFKA_HARNESS_RUN, default a fresh temp dir), so clusters
# of other users of the harness are left alone. Ports (all 127.0.0.1; controller = PORT+1):
# SRC_PORT 19092, DST_PORT 29092, TLS_PORT 19292, MTLS_PORT 19392, SASL_SSL_PORT 19492.
# KEEP=1 keeps the run dir (logs) also on success; on failure it is always kept.
set -euo pipefail
H="$(cd "$(dirname "$0")" && pwd)/kafka-harness.sh"
SRC_PORT="${SRC_PORT:-19092}"
DST_PORT="${DST_PORT:-29092}"
TLS_PORT="${TLS_PORT:-19292}"
MTLS_PORT="${MTLS_PORT:-19392}"
SASL_SSL_PORT="${SASL_SSL_PORT:-19492}"
SRC="127.0.0.1:$SRC_PORT"
DST="127.0.0.1:$DST_PORT"
N=10000
tmp="$(mktemp -d "${TMPDIR:-/tmp}/kafka-smoke.XXXXXX")"
export KAFKA_HARNESS_RUN="${KAFKA_HARNESS_RUN:-$tmp/run}"
ok=""
cleanup() {
  "$H" stop-all || true
  if [[ -n "$ok" && -z "${KEEP:-}" ]]; then rm -rf "$tmp"; else echo "kept logs and configs in $tmp" >&2; fi
}
trap cleanup EXIT
step() { printf '\n== %s (t=%ss)\n' "$*" "$SECONDS"; }
fail() { echo "FAILED: $*" >&2; exit 1; }
sum_offsets() { awk -F: '{ s += $NF } END { print s + 0 }'; }
have() { command -v "$1" >/dev/null 2>&1; }
timed() {  # timed WHAT NAME CMD...: run CMD (stdout discarded), print its wall time
  local what="$1" name="$2" t0 t1; shift 2
  t0="$(date +%s%N)"
  "$@" >/dev/null
  t1="$(date +%s%N)"
  printf 'TIME %s %s: %d.%01ds\n' "$what" "$name" $(((t1 - t0) / 1000000000)) $(((t1 - t0) / 100000000 % 10))
}
records() { local i; for i in 1 2 3; do echo "$1-record-$i"; done; }
rss() {  # rss NAME KIND: resident memory of RUN/NAME/KIND.pid
  local pf; pf="$("$H" dir "$1")/$2.pid"
  echo "RSS $1 $2: $(awk '/^VmRSS/ { printf "%d MB", $2 / 1024 }' "/proc/$(cat "$pf")/status" 2>/dev/null)"
}
envval() { sed -n "s/^$2=//p" "$("$H" dir "$1")/env"; }

# roundtrip LABEL BOOTSTRAP ADMIN_CFG CLIENT_CFG: create topic rt-LABEL (as admin), produce 3 records
# with the console producer and consume them back with the console consumer (group rt-LABEL),
# both with CLIENT_CFG; the consumed values must equal the produced ones.
roundtrip() {
  local label="$1" bs="$2" admin="$3" cfg="$4" topic="rt-$1" expected got
  "$H" tool topics --bootstrap-server "$bs" --command-config "$admin" --create --if-not-exists \
    --topic "$topic" --partitions 1 --replication-factor 1 >/dev/null
  expected="$(records "$label")"
  printf '%s\n' "$expected" | "$H" tool console-producer --bootstrap-server "$bs" --topic "$topic" \
    "$PCFG" "$cfg" 2>"$tmp/producer-$label.err" \
    || { cat "$tmp/producer-$label.err"; fail "console producer ($label)"; }
  got="$("$H" tool console-consumer --bootstrap-server "$bs" --topic "$topic" "$CCFG" "$cfg" \
    --group "$topic" --from-beginning --max-messages 3 --timeout-ms 30000 2>"$tmp/consumer-$label.err")" || true
  if [[ "$got" != "$expected" ]]; then
    cat "$tmp/consumer-$label.err" >&2
    fail "round trip $label: expected [$expected] got [$got]"
  fi
  echo "round trip $label OK ($(wc -l <<<"$got") records via $(basename "$cfg"))"
}

step "fetch jars"
"$H" fetch

# Kafka 4.2+ prints a deprecation notice for --producer.config/--consumer.config (the consumer on
# stdout, mixed with the records): use --command-config where the tools have it.
PCFG=--producer.config CCFG=--consumer.config
help="$("$H" tool console-consumer --help 2>&1 || true)"   # --help exits non-zero
if grep -q -- '--command-config' <<<"$help"; then
  PCFG=--command-config CCFG=--command-config
fi

# librdkafka before 2.6.1 cannot do SCRAM against Kafka 4.x brokers (it re-appends the client nonce in
# client-final-message, which 4.x rejects as "invalid credentials"; librdkafka#4895). Debian 12's
# kcat uses librdkafka 2.0.2, so kcat uses PLAIN there (Java clients cover SCRAM).
RDK="" KCAT_MECH=PLAIN KCAT_SCRAM=""
if have kcat; then
  RDK="$(kcat -V 2>&1 | sed -n 's/.*librdkafka \([0-9][0-9.]*\).*/\1/p' | head -n 1)"
  if [[ "$(printf '%s\n' 2.6.1 "${RDK:-0}" | sort -V | head -n 1)" == 2.6.1 ]]; then
    KCAT_MECH=SCRAM-SHA-256 KCAT_SCRAM=SCRAM-SHA-512
  fi
fi

step "start src (PLAINTEXT) and dst (--acl --scram) in parallel"
t0=$SECONDS
"$H" start src "$SRC_PORT" & p1=$!
"$H" start dst "$DST_PORT" --acl --scram & p2=$!
wait "$p1" || fail "start src"
wait "$p2" || fail "start dst"
echo "TIME two clusters in parallel: $((SECONDS - t0))s"
ADMIN_DST="$("$H" client-config dst)"
ALICE_DST="$("$H" client-config dst alice)"
[[ "$(envval dst SECURITY_PROTOCOL)" == SASL_PLAINTEXT ]] || fail "dst env SECURITY_PROTOCOL"
[[ "$(envval dst SASL_MECHANISMS)" == PLAIN,SCRAM-SHA-256,SCRAM-SHA-512 ]] || fail "dst env SASL_MECHANISMS"

step "src: create topic, produce $N records with the perf tool, console round trip"
"$H" tool topics --bootstrap-server "$SRC" --create --topic t1 --partitions 3 --replication-factor 1
"$H" tool producer-perf-test --topic t1 --num-records "$N" --record-size 100 --throughput -1 \
  --producer-props "bootstrap.servers=$SRC" acks=all
got="$("$H" tool get-offsets --bootstrap-server "$SRC" --topic t1 | sum_offsets)"
[[ "$got" -eq "$N" ]] || fail "expected $N records on src, got $got"
roundtrip plaintext "$SRC" "$("$H" client-config src)" "$("$H" client-config src)"

step "dst: ACLs for alice (prefixed rt- topics/groups, src.* topics, group g1)"
acl() { "$H" tool acls --bootstrap-server "$DST" --command-config "$ADMIN_DST" --add --allow-principal User:alice "$@" >/dev/null; }
acl --operation Read --operation Write --operation Describe --resource-pattern-type prefixed --topic rt-
acl --operation Read --resource-pattern-type prefixed --group rt-
acl --operation Read --operation Describe --resource-pattern-type prefixed --topic src.
acl --operation Read --group g1
"$H" tool acls --bootstrap-server "$DST" --command-config "$ADMIN_DST" --list | grep -q 'principal=User:alice' \
  || fail "ACL listing lacks User:alice"
if "$H" tool topics --bootstrap-server "$DST" --command-config "$ALICE_DST" \
     --create --topic forbidden --partitions 1 --replication-factor 1 >/dev/null 2>&1; then
  fail "alice could create a topic: authorizer not enforcing"
fi
echo "alice may not create topics (authorizer enforces)"
BOB256="$("$H" client-config dst bob-scram256)"
"$H" tool topics --bootstrap-server "$DST" --command-config "$BOB256" --list >/dev/null || fail "bob SCRAM-SHA-256 login"
sed 's/password="bob-secret"/password="wrong"/' "$BOB256" >"$tmp/bob-wrong.properties"
if timeout 60 "$H" tool topics --bootstrap-server "$DST" --command-config "$tmp/bob-wrong.properties" \
     --list >/dev/null 2>&1; then
  fail "SCRAM login with a wrong password succeeded"
fi
echo "SCRAM-SHA-256 rejects a wrong password"

step "dst: console round trips as alice over SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
roundtrip sasl-plain "$DST" "$ADMIN_DST" "$ALICE_DST"
roundtrip scram-sha-256 "$DST" "$ADMIN_DST" "$("$H" client-config dst alice-scram256)"
roundtrip scram-sha-512 "$DST" "$ADMIN_DST" "$("$H" client-config dst alice-scram512)"

step "MirrorMaker 2 (dedicated mode) src -> dst"
cat >"$tmp/mm2.properties" <<EOF
clusters = src, dst
src.bootstrap.servers = $SRC
dst.bootstrap.servers = $DST
dst.security.protocol = SASL_PLAINTEXT
dst.sasl.mechanism = PLAIN
dst.sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret";
src->dst.enabled = true
src->dst.topics = t1, rt-plaintext
dst->src.enabled = false
# no reverse herder just for heartbeats (saves a Connect worker on 2 cores)
dst->src.emit.heartbeats.enabled = false
# src has no authorizer: do not try to read ACLs there
sync.topic.acls.enabled = false
# single-node clusters: every replication factor 1
replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
config.storage.replication.factor = 1
refresh.topics.interval.seconds = 5
refresh.groups.interval.seconds = 5
sync.topic.configs.interval.seconds = 5
emit.checkpoints.interval.seconds = 1
sync.group.offsets.enabled = true
sync.group.offsets.interval.seconds = 1
EOF
t0=$SECONDS
"$H" mm2 -d mm2 "$tmp/mm2.properties"
got=0
for _ in $(seq 60); do
  got="$("$H" tool get-offsets --bootstrap-server "$DST" --command-config "$ADMIN_DST" --topic src.t1 2>/dev/null | sum_offsets || true)"
  [[ "${got:-0}" -ge "$N" ]] && break
  sleep 3
done
[[ "${got:-0}" -ge "$N" ]] || { tail -n 50 "$("$H" dir mm2)/logs/mm2.log"; fail "MM2 replicated ${got:-0}/$N records"; }
echo "MM2 replicated $got records of t1 in $((SECONDS - t0))s (incl. MM2 start)"
want="$(records plaintext)"
got="$("$H" tool console-consumer --bootstrap-server "$DST" "$CCFG" "$ALICE_DST" \
  --topic src.rt-plaintext --group g1 --from-beginning --max-messages 3 --timeout-ms 60000 2>/dev/null)" || true
[[ "$got" == "$want" ]] || fail "MM2 copy of rt-plaintext: expected [$want] got [$got]"
echo "MM2 copied rt-plaintext -> src.rt-plaintext with identical content; alice read it on dst"
rss src broker; rss dst broker; rss mm2 mm2

if have kcat; then
  step "kcat (librdkafka $RDK) reads src.t1 on dst as alice via $KCAT_MECH"
  kcat -b "$SRC" -L -t t1 | head -n 3
  timeout 30 kcat -b "$DST" -X security.protocol=SASL_PLAINTEXT -X "sasl.mechanisms=$KCAT_MECH" \
    -X sasl.username=alice -X sasl.password=alice-secret -C -t src.t1 -c 3 -e -q >/dev/null \
    || fail "kcat $KCAT_MECH"
  echo "kcat OK"
fi

step "stop mm2, src, dst"
"$H" stop mm2
"$H" stop src
"$H" stop dst

step "SSL cluster (--ssl)"
timed start tls "$H" start tls "$TLS_PORT" --ssl
TLS="$("$H" bootstrap tls)"
[[ "$(envval tls SECURITY_PROTOCOL)" == SSL ]] || fail "tls env SECURITY_PROTOCOL"
for k in SSL_CA_PEM SSL_CLIENT_CERT_PEM SSL_CLIENT_KEY_PEM SSL_TRUSTSTORE_P12 SSL_KEYSTORE_P12; do
  [[ -s "$(envval tls "$k")" ]] || fail "tls env $k does not name a file"
done
roundtrip ssl "$TLS" "$("$H" client-config tls)" "$("$H" client-config tls)"
if have kcat; then
  timeout 30 kcat -b "$TLS" -X security.protocol=SSL -X "ssl.ca.location=$(envval tls SSL_CA_PEM)" \
    -C -t rt-ssl -c 3 -e -q >/dev/null || fail "kcat over SSL with ca.pem"
  echo "kcat read rt-ssl over SSL (ca.pem)"
fi
step "restart the SSL cluster on the same data"
timed restart tls "$H" restart tls
got="$("$H" tool console-consumer --bootstrap-server "$TLS" "$CCFG" "$("$H" client-config tls)" \
  --topic rt-ssl --from-beginning --max-messages 3 --timeout-ms 30000 2>/dev/null)" || true
[[ "$got" == "$(records ssl)" ]] || fail "records lost across restart: [$got]"
echo "records survived restart"
"$H" stop tls

step "mTLS cluster (--mtls)"
timed start mtls "$H" start mtls "$MTLS_PORT" --mtls
MTLS="$("$H" bootstrap mtls)"
[[ "$(envval mtls SSL_CLIENT_AUTH)" == required ]] || fail "mtls env SSL_CLIENT_AUTH"
roundtrip mtls "$MTLS" "$("$H" client-config mtls)" "$("$H" client-config mtls)"
if timeout 60 "$H" tool topics --bootstrap-server "$MTLS" --command-config "$("$H" client-config mtls nocert)" \
     --list >/dev/null 2>&1; then
  fail "mTLS broker accepted a client without certificate"
fi
echo "client without certificate rejected"
ca="$(envval mtls SSL_CA_PEM)" cert="$(envval mtls SSL_CLIENT_CERT_PEM)" key="$(envval mtls SSL_CLIENT_KEY_PEM)"
grep -q 'BEGIN PRIVATE KEY' "$key" || fail "client key is not PKCS#8 PEM"
openssl pkcs12 -in "$(envval mtls SSL_KEYSTORE_P12)" -passin "pass:$(envval mtls SSL_STORE_PASSWORD)" -nokeys \
  2>/dev/null | grep -q 'BEGIN CERTIFICATE' || fail "client.p12 does not open with SSL_STORE_PASSWORD"
echo | timeout 20 openssl s_client -connect "$MTLS" -CAfile "$ca" -cert "$cert" -key "$key" \
  -verify_ip 127.0.0.1 -verify_return_error >"$tmp/s_client.log" 2>&1 || { cat "$tmp/s_client.log"; fail "openssl s_client with the PEM files"; }
echo "openssl s_client handshake with ca.pem + client.pem + client.key verified"
if have kcat; then
  timeout 30 kcat -b "$MTLS" -X security.protocol=SSL -X "ssl.ca.location=$ca" \
    -X "ssl.certificate.location=$cert" -X "ssl.key.location=$key" -C -t rt-mtls -c 3 -e -q >/dev/null \
    || fail "kcat mTLS with PEM files"
  timeout 30 kcat -b "$MTLS" -X security.protocol=SSL -X "ssl.ca.location=$ca" \
    -X "ssl.keystore.location=$(envval mtls SSL_KEYSTORE_P12)" \
    -X "ssl.keystore.password=$(envval mtls SSL_STORE_PASSWORD)" -C -t rt-mtls -c 3 -e -q >/dev/null \
    || fail "kcat mTLS with client.p12"
  echo "kcat read rt-mtls over mTLS (PEM files, and client.p12)"
fi
"$H" stop mtls

step "SASL_SSL cluster (--ssl --scram --acl)"
timed start sasl_ssl "$H" start sasl_ssl "$SASL_SSL_PORT" --ssl --scram --acl
SS="$("$H" bootstrap sasl_ssl)"
ADMIN_SS="$("$H" client-config sasl_ssl)"
[[ "$(envval sasl_ssl SECURITY_PROTOCOL)" == SASL_SSL ]] || fail "sasl_ssl env SECURITY_PROTOCOL"
"$H" tool acls --bootstrap-server "$SS" --command-config "$ADMIN_SS" --add --allow-principal User:alice \
  --operation Read --operation Write --operation Describe --resource-pattern-type prefixed --topic rt- >/dev/null
"$H" tool acls --bootstrap-server "$SS" --command-config "$ADMIN_SS" --add --allow-principal User:alice \
  --operation Read --resource-pattern-type prefixed --group rt- >/dev/null
roundtrip sasl_ssl-plain "$SS" "$ADMIN_SS" "$("$H" client-config sasl_ssl alice)"
roundtrip sasl_ssl-scram-sha-256 "$SS" "$ADMIN_SS" "$("$H" client-config sasl_ssl alice-scram256)"
if have kcat; then
  m="${KCAT_SCRAM:-PLAIN}"
  timeout 30 kcat -b "$SS" -X security.protocol=SASL_SSL -X "sasl.mechanisms=$m" \
    -X sasl.username=alice -X sasl.password=alice-secret -X "ssl.ca.location=$(envval sasl_ssl SSL_CA_PEM)" \
    -C -t rt-sasl_ssl-scram-sha-256 -c 3 -e -q >/dev/null || fail "kcat SASL_SSL $m"
  echo "kcat read over SASL_SSL with $m"
fi

step "stop-all leaves no JVM behind"
"$H" stop-all
sleep 1
if pgrep -af -- "-Dkafka.harness.dir=$KAFKA_HARNESS_RUN/" >&2; then fail "JVMs of this run still alive after stop-all"; fi
echo "no JVM of $KAFKA_HARNESS_RUN left"
ok=1
echo "SMOKE TEST PASSED in ${SECONDS}s"
