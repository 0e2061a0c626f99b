#!/usr/bin/env bash
# Demo: two local Kafka clusters (A: PLAINTEXT, B: SASL/PLAIN), sample topics with data on A,
# kmirror's plan for examples/mm2.properties, then kmirror replicating A to B, and a comparison
# of end offsets and of the records themselves. Stops its brokers and kmirror on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
H=scripts/kafka/kafka-harness.sh
export KAFKA_HARNESS_RUN="${TMPDIR:-/tmp}/kmirror-demo-$$"
KPID=""
trap '[[ -n "$KPID" ]] && kill "$KPID" 2>/dev/null; bash $H stop-all >/dev/null 2>&1; rm -rf "$KAFKA_HARNESS_RUN"' EXIT

bash $H fetch
cargo build -q --bin kmirror

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick() { local p; for p in $(seq "$1" 2 "$2"); do if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi; done; exit 1; }
PA=$(pick 19092 19190); PB=$(pick $((PA + 2)) 19290)

echo "== starting cluster A (PLAINTEXT, port $PA) and B (SASL/PLAIN, port $PB)"
bash $H start demo-a "$PA" & a=$!
bash $H start demo-b "$PB" --sasl & b=$!
wait $a; wait $b

ACFG=$(bash $H client-config demo-a)
echo "== creating topics on A and loading sample data"
for t in orders:3 payments.eu:2 payments.us:2 audit.log:1; do
  bash $H tool topics --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG" \
    --create --topic "${t%%:*}" --partitions "${t##*:}" --replication-factor 1
done
seq 1 1000 | sed 's/^/order-/' | bash $H tool console-producer --bootstrap-server "127.0.0.1:$PA" \
  --producer.config "$ACFG" --topic orders
seq 1 200 | sed 's/^/payment-/' | bash $H tool console-producer --bootstrap-server "127.0.0.1:$PA" \
  --producer.config "$ACFG" --topic payments.eu
bash $H tool get-offsets --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG"

cfg="$KAFKA_HARNESS_RUN/mm2.properties"
sed -e "s/127.0.0.1:19092/127.0.0.1:$PA/" -e "s/127.0.0.1:19094/127.0.0.1:$PB/" examples/mm2.properties >"$cfg"
echo "== kmirror plan $cfg"
./target/debug/kmirror plan "$cfg"
echo "== kmirror run $cfg (until B holds every record)"
./target/debug/kmirror run "$cfg" >"$KAFKA_HARNESS_RUN/kmirror.log" 2>&1 &
KPID=$!
BCFG=$(bash $H client-config demo-b)
offsets() {  # offsets CLUSTER_PORT CONFIG TOPIC -> "partition:end" lines
  bash $H tool get-offsets --bootstrap-server "127.0.0.1:$1" --command-config "$2" --topic "$3" 2>/dev/null | sed 's/^[^:]*://' | sort
}
deadline=$((SECONDS + 90))
until [[ "$(offsets "$PA" "$ACFG" orders)" == "$(offsets "$PB" "$BCFG" A.orders)" &&
         "$(offsets "$PA" "$ACFG" payments.eu)" == "$(offsets "$PB" "$BCFG" A.payments.eu)" ]]; do
  if ((SECONDS > deadline)); then echo "demo: replication did not catch up; log:" >&2; tail -20 "$KAFKA_HARNESS_RUN/kmirror.log" >&2; exit 1; fi
  sleep 2
done
kill -TERM "$KPID"; wait "$KPID" || true; KPID=""
echo "== end offsets per partition (source A -> target B)"
for t in orders payments.eu payments.us; do
  printf '%-14s A: %s\n%-14s B: %s\n' "$t" "$(offsets "$PA" "$ACFG" "$t" | tr '\n' ' ')" "A.$t" "$(offsets "$PB" "$BCFG" "A.$t" | tr '\n' ' ')"
done
echo "== records: first and last of A.orders on B"
bash $H tool console-consumer --bootstrap-server "127.0.0.1:$PB" --command-config "$BCFG" --topic A.orders \
  --from-beginning --max-messages 1000 --timeout-ms 20000 2>/dev/null | sed -n '1p;$p'
echo "== audit.log was not replicated (topics = orders, payments.*):"
bash $H tool topics --bootstrap-server "127.0.0.1:$PB" --command-config "$BCFG" --list | grep -v '^__' | sed 's/^/   /'
echo "== demo complete: every record of orders and payments.* is on B, positions in mm2-offsets.A.internal"
