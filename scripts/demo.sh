#!/usr/bin/env bash
# Demo: two local Kafka clusters (A: PLAINTEXT, B: SASL/PLAIN), sample topics with data on A,
# and what kmirror makes of examples/mm2.properties. Stops its brokers on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
H=scripts/kafka/kafka-harness.sh
export KAFKA_HARNESS_RUN="${TMPDIR:-/tmp}/kmirror-demo-$$"
trap 'bash $H stop-all >/dev/null 2>&1; rm -rf "$KAFKA_HARNESS_RUN"' EXIT

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
echo "== done: the replication engine (next milestone) will copy orders and payments.* to B as A.orders, A.payments.eu, ..."
