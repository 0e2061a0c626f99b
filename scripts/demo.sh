#!/usr/bin/env bash
# Demo: two local Kafka clusters (A: PLAINTEXT, B: SASL/PLAIN), sample topics on A (keys,
# headers, lz4 and zstd, a compacted topic), kmirror's plan for examples/mm2.properties, then
# kmirror replicating A to B, a peek at its metrics, a comparison of end offsets and records, and
# kmirror verify; then, when Java 21+ is there for two schema registries (Apicurio), Avro records
# copied with their schemas and read on B through B's registry (skipped, saying why, without).
# Stops its brokers, registries and kmirror on exit.
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
echo "== creating topics on A and loading sample data (keys, headers, lz4 and zstd, a compacted topic)"
create() {  # create TOPIC PARTITIONS [--config k=v ...]
  local t="$1" n="$2"; shift 2
  bash $H tool topics --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG" \
    --create --topic "$t" --partitions "$n" --replication-factor 1 "$@"
}
create orders 3 --config retention.ms=604800000
create payments.eu 2
create payments.us 2
create customers 1 --config cleanup.policy=compact
create audit.log 1
load() {  # load TOPIC CODEC < "headers<TAB>key<TAB>value" lines
  bash $H tool console-producer --bootstrap-server "127.0.0.1:$PA" --producer.config "$ACFG" \
    --topic "$1" --compression-codec "$2" --property parse.key=true --property parse.headers=true \
    --property key.separator=$'\t' --property headers.delimiter=$'\t'
}
for i in $(seq 1 1000); do printf 'source:web,trace:%s\tcustomer-%s\torder-%s\n' "$i" $((i % 37)) "$i"; done | load orders lz4
for i in $(seq 1 200); do printf 'currency:EUR\tpay-%s\tpayment-%s\n' "$i" "$i"; done | load payments.eu zstd
for i in $(seq 1 300); do printf 'v:%s\tcustomer-%s\tprofile-%s\n' "$i" $((i % 50)) "$i"; done | load customers none
seq 1 50 | sed 's/^/audit-/' | bash $H tool console-producer --bootstrap-server "127.0.0.1:$PA" \
  --producer.config "$ACFG" --topic audit.log
bash $H tool get-offsets --bootstrap-server "127.0.0.1:$PA" --command-config "$ACFG"

cfg="$KAFKA_HARNESS_RUN/mm2.properties"
sed -e "s/127.0.0.1:19092/127.0.0.1:$PA/" -e "s/127.0.0.1:19094/127.0.0.1:$PB/" examples/mm2.properties >"$cfg"
echo "== kmirror plan $cfg"
./target/debug/kmirror plan "$cfg"
echo "== kmirror run $cfg (until B holds every record)"
./target/debug/kmirror run "$cfg" --metrics-address 127.0.0.1:0 >"$KAFKA_HARNESS_RUN/kmirror.log" 2>&1 &
KPID=$!
BCFG=$(bash $H client-config demo-b)
TOPICS="orders payments.eu payments.us customers"
offsets() {  # offsets CLUSTER_PORT CONFIG TOPIC -> "partition:end" lines
  bash $H tool get-offsets --bootstrap-server "127.0.0.1:$1" --command-config "$2" --topic "$3" 2>/dev/null | sed 's/^[^:]*://' | sort
}
caught_up() {
  local t
  for t in $TOPICS; do [[ "$(offsets "$PA" "$ACFG" "$t")" == "$(offsets "$PB" "$BCFG" "A.$t")" ]] || return 1; done
}
deadline=$((SECONDS + 120))
until caught_up; do
  if ((SECONDS > deadline)); then echo "demo: replication did not catch up; log:" >&2; tail -20 "$KAFKA_HARNESS_RUN/kmirror.log" >&2; exit 1; fi
  sleep 2
done
maddr=$(grep -o 'address=[0-9.:]*' "$KAFKA_HARNESS_RUN/kmirror.log" | head -1 | cut -d= -f2 || true)
if [[ -n "$maddr" ]]; then
  echo "== a few of kmirror's Prometheus metrics (http://$maddr/metrics)"
  exec 3<>"/dev/tcp/${maddr%:*}/${maddr##*:}"
  printf 'GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n' "$maddr" >&3
  grep -E '^kmirror_(batches_total|topics|partitions|record_count_total\{[^}]*topic="A.orders",partition="0")' <&3 | sed 's/^/   /' || true
  exec 3<&-
fi
kill -TERM "$KPID"; wait "$KPID" || true; KPID=""
echo "== end offsets per partition (source A -> target B)"
for t in $TOPICS; do
  printf '%-12s A: %s\n%-12s B: %s\n' "$t" "$(offsets "$PA" "$ACFG" "$t" | tr '\n' ' ')" "A.$t" "$(offsets "$PB" "$BCFG" "A.$t" | tr '\n' ' ')"
done
records() {  # records PORT CONFIG TOPIC -> "partition timestamp headers key value" lines, sorted
  bash $H tool console-consumer --bootstrap-server "127.0.0.1:$1" --consumer.config "$2" --topic "$3" \
    --from-beginning --timeout-ms 6000 --property print.partition=true --property print.timestamp=true \
    --property print.headers=true --property print.key=true 2>/dev/null | grep -E '^(CreateTime|LogAppendTime):' | sort || true
}
echo "== records compared (partition, timestamp, headers, key, value)"
for t in $TOPICS; do
  ra=$(records "$PA" "$ACFG" "$t"); rb=$(records "$PB" "$BCFG" "A.$t")
  if [[ "$ra" == "$rb" ]]; then
    printf '   %-12s -> A.%-12s identical (%s records)\n' "$t" "$t" "$(grep -c . <<<"$ra" || true)"
  else
    echo "demo: A.$t differs from $t" >&2; diff <(echo "$ra") <(echo "$rb") | head -5 >&2; exit 1
  fi
done
echo "== kmirror verify $cfg --deep 5 (topics, partitions, counts, freshness, configs, last records)"
if ! ./target/debug/kmirror verify "$cfg" --deep 5; then
  echo "demo: kmirror verify found a difference" >&2; exit 1
fi
echo "== example record on B (A.orders):"
records "$PB" "$BCFG" A.orders | sed -n '1s/^/   /p'
echo "== topics on B (audit.log was not replicated: topics = orders, payments.*, customers):"
bash $H tool topics --bootstrap-server "127.0.0.1:$PB" --command-config "$BCFG" --list | grep -v '^__' | sed 's/^/   /'
schemas_demo() {  # Avro records and their schemas between two registries (Apicurio, Java 21+)
  local ra rb url_a url_b out scfg schema n=200 ids
  echo "== schema registries: Avro records with their schemas, ids translated (docs/migrating-schemas.md)"
  ra=$(pick 19300 19390); rb=$(pick $((ra + 2)) 19398)
  for r in "demo-sr-a $ra" "demo-sr-b $rb"; do
    # shellcheck disable=SC2086
    if ! out=$(bash $H registry start $r 2>&1); then
      echo "   skipped: ${out##*kafka-harness: }"; return 0
    fi
  done
  if ! out=$(bash $H serde fetch 2>&1); then echo "   skipped: ${out##*kafka-harness: }"; return 0; fi
  url_a=$(bash $H registry url demo-sr-a); url_b=$(bash $H registry url demo-sr-b)
  # The target registry holds a schema of its own, so the ids differ and records are rewritten.
  curl -sf -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
    --data '{"schema": "{\"type\":\"record\",\"name\":\"Local\",\"fields\":[]}"}' "$url_b/subjects/local-value/versions" >/dev/null
  create orders.avro 3
  schema="$KAFKA_HARNESS_RUN/order.avsc"
  echo '{"type":"record","name":"Order","namespace":"demo","fields":[{"name":"id","type":"long"},{"name":"name","type":"string"}]}' >"$schema"
  bash $H serde produce --bootstrap "127.0.0.1:$PA" --client-config "$ACFG" --registry "$url_a" \
    --topic orders.avro --schema "$schema" --count $n --partitions 3
  scfg="$KAFKA_HARNESS_RUN/schemas.properties"
  sed -e 's/^A->B.topics = .*/A->B.topics = orders.avro/' "$cfg" >"$scfg"
  printf 'A.schema.registry.url = %s\nB.schema.registry.url = %s\nA->B.kmirror.schemas.ids = translate\n' "$url_a" "$url_b" >>"$scfg"
  echo "== kmirror plan $scfg (its schema part)"
  ./target/debug/kmirror plan "$scfg" | grep -A3 '^  schemas'
  ./target/debug/kmirror run "$scfg" --metrics-address 127.0.0.1:0 >"$KAFKA_HARNESS_RUN/kmirror-schemas.log" 2>&1 &
  KPID=$!
  if ! out=$(bash $H serde consume --bootstrap "127.0.0.1:$PB" --client-config "$BCFG" --registry "$url_b" \
    --topic A.orders.avro --count $n --timeout 90); then
    echo "demo: A.orders.avro did not decode through B's registry; log:" >&2; tail -20 "$KAFKA_HARNESS_RUN/kmirror-schemas.log" >&2; exit 1
  fi
  kill -TERM "$KPID"; wait "$KPID" || true; KPID=""
  ids=$(bash $H serde consume --bootstrap "127.0.0.1:$PA" --client-config "$ACFG" --registry "$url_a" \
    --topic orders.avro --count 1 --timeout 30 | sed -n 's/.*"value_schema_id": \([0-9]*\).*/\1/p')
  echo "   $(grep -c . <<<"$out") records on B decode through B's registry; schema id $ids on A is $(sed -n '1s/.*"value_schema_id": \([0-9]*\).*/\1/p' <<<"$out") on B"
  echo "   one of them: $(head -1 <<<"$out")"
  echo "   subjects on B: $(curl -sf "$url_b/subjects")"
}
schemas_demo

echo "== demo complete: every record matches; positions are in mm2-offsets.A.internal on B"
