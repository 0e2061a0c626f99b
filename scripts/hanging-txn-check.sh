#!/usr/bin/env bash
# Repeats the two scenarios in which Kafka's transaction coordinator drops a marker for a
# partition without a leader (KAFKA-20734; docs/engine.md, "Transactions whose marker was
# dropped") and counts, per run, the markers the brokers' logs say were skipped and what kmirror
# found and settled:
#   - real_kafka_txn's dropped-marker test: a 3-broker target, a replication-factor-1 partition
#     whose broker stops between the produce and EndTxn (twice per run);
#   - real_kafka_eos_crash: kmirror exactly-once into a single-node target that restarts
#     mid-copy (with kill -9 and SIGSTOP around it), audited for loss and duplicates.
# Not part of CI (each run takes about a minute and a half); bounded by RUNS and RUN_TIMEOUT.
#
#   RUNS=5 RUN_TIMEOUT=300 bash scripts/hanging-txn-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo test -q -p kmirror-kafka --test it --no-run
cargo test -q -p kmirror-cli --test serial --no-run
failed=0
for i in $(seq 1 "$RUNS"); do
  if ! timeout "$RUN_TIMEOUT" cargo test -q -p kmirror-kafka --test it real_kafka_txn::a_marker_dropped -- --nocapture >"$out/txn-$i.log" 2>&1; then
    failed=$((failed + 1)); echo "run $i: the dropped-marker test FAILED (log: kept below)"; tail -20 "$out/txn-$i.log"
  fi
  if ! timeout "$RUN_TIMEOUT" cargo test -q -p kmirror-cli --test serial real_kafka_eos_crash -- --nocapture >"$out/eos-$i.log" 2>&1; then
    failed=$((failed + 1)); echo "run $i: real_kafka_eos_crash FAILED"; grep -E "^eos:|panicked|assert" "$out/eos-$i.log" | head -20
  fi
  rf1=$(grep -E "markers skipped by the coordinator" "$out/txn-$i.log" | sed -E 's/.*: //' | awk '{ s += $1 } END { print s + 0 }')
  eos=$(grep -E "^eos: markers skipped" "$out/eos-$i.log" | sed -E 's/^eos: //' || echo "no count")
  audit=$(grep -E "^eos: faults" "$out/eos-$i.log" | sed -E 's/.*(lost [0-9]+, duplicates [0-9]+).*/\1/' || echo "no audit")
  echo "run $i/$RUNS: 3-broker RF1: skipped markers $rf1 (of 2 stops); single-node restart: $eos; $audit"
done
echo "hanging-txn-check: $RUNS runs, $failed failed"
exit $((failed > 0))
