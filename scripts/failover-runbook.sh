#!/usr/bin/env bash
# Runs the consumer-group runbooks of docs/failover.md on two local clusters and prints every
# command with its output: a group consumes part of `payments` on A, kmirror replicates A->B with
# checkpoints, the group fails over to B (translate, apply, consume on B), then fails back to A
# with B->A enabled. Stops its brokers on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
H=scripts/kafka/kafka-harness.sh
export KAFKA_HARNESS_RUN="${TMPDIR:-/tmp}/kmirror-runbook-$$"
KPID=""
trap '[[ -n "$KPID" ]] && kill "$KPID" 2>/dev/null; bash $H stop-all >/dev/null 2>&1; rm -rf "$KAFKA_HARNESS_RUN"' EXIT
bash $H fetch >/dev/null
cargo build -q --bin kmirror
K=./target/debug/kmirror

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick() { local p; for p in $(seq "$1" 2 "$2"); do if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi; done; exit 1; }
PA=$(pick 19392 19490); PB=$(pick $((PA + 2)) 19590)
bash $H start rb-a "$PA" >/dev/null & a=$!
bash $H start rb-b "$PB" >/dev/null & b=$!
wait $a; wait $b
ACFG=$(bash $H client-config rb-a); BCFG=$(bash $H client-config rb-b)
show() { echo "\$ $*"; "$@" 2>&1 | sed 's/^/  /'; echo; }
tool() { bash $H tool "$@" 2>/dev/null; }

tool topics --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG" --create --topic payments --partitions 2 --replication-factor 1 >/dev/null
seq 1 1000 | sed 's/.*/k&:payment-&/' | tool console-producer --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG" \
  --topic payments --reader-property parse.key=true --reader-property key.separator=: >/dev/null
tool console-consumer --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG" --topic payments --group billing \
  --from-beginning --max-messages 600 --timeout-ms 15000 >/dev/null
cfg="$KAFKA_HARNESS_RUN/mm2.properties"
cat >"$cfg" <<EOF
clusters = A, B
A.bootstrap.servers = 127.0.0.1:$PA
B.bootstrap.servers = 127.0.0.1:$PB
A->B.enabled = true
A->B.topics = payments
B->A.enabled = false
emit.checkpoints.interval.seconds = 5
replication.factor = 1
offset.storage.replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
EOF

echo "### 1. The group on A (billing read 600 of 1000 records)"
show bash $H tool consumer-groups --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG" --describe --group billing
echo "### 2. kmirror replicates A->B and writes checkpoints"
$K run "$cfg" --metrics-address off >"$KAFKA_HARNESS_RUN/run1.log" 2>&1 & KPID=$!
for _ in $(seq 60); do
  if $K offsets translate "$cfg" --source A --target B --group billing >/dev/null 2>&1; then break; fi
  sleep 1
done
echo "### 3. Failover: stop the consumers on A, check and apply the translated offsets on B"
show $K offsets translate "$cfg" --source A --target B --group billing
show $K offsets apply "$cfg" --source A --target B --group billing --dry-run
show $K offsets apply "$cfg" --source A --target B --group billing
echo "### 4. The consumers start on B with the same group: they continue at the next record"
show bash $H tool consumer-groups --bootstrap-server "127.0.0.1:$PB" --command-config "$BCFG" --describe --group billing
echo "\$ kafka-console-consumer --bootstrap-server B --topic A.payments --group billing --max-messages 3 --property print.partition=true"
tool console-consumer --bootstrap-server "127.0.0.1:$PB" --command-config "$BCFG" --topic A.payments --group billing \
  --max-messages 400 --timeout-ms 15000 --formatter-property print.partition=true | sort -t- -k2 -n | head -3 | sed 's/^/  /'
echo
kill -TERM "$KPID"; wait "$KPID" || true; KPID=""

echo "### 5. Failback: with B->A enabled, the group's offsets on B (topic A.payments) go back to A (topic payments)"
sed -i 's/^B->A.enabled = false/B->A.enabled = true/' "$cfg"
$K run "$cfg" --metrics-address off >"$KAFKA_HARNESS_RUN/run2.log" 2>&1 & KPID=$!
for _ in $(seq 60); do
  if $K offsets translate "$cfg" --source B --target A --group billing >/dev/null 2>&1; then break; fi
  sleep 1
done
show $K offsets translate "$cfg" --source B --target A --group billing
show $K offsets apply "$cfg" --source B --target A --group billing
show bash $H tool consumer-groups --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG" --describe --group billing
kill -TERM "$KPID"; wait "$KPID" || true; KPID=""
echo "runbook complete"
