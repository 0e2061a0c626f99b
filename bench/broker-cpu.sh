#!/usr/bin/env bash
# The CPU a test's broker costs, by JVM mode of the harness (KAFKA_HARNESS_BROKER_JVM): one
# single-node broker started, a 6-partition topic, 50,000 records of 500 bytes produced with the
# Java perf producer, 20 s idle; then the broker JVM's user+system CPU seconds from /proc. The
# testkit starts its brokers "light" (C1 only, serial collector); benchmarks and the demo "full".
#
#   bash bench/broker-cpu.sh            full and light, 3 rounds each, alternating
#   ROUNDS=1 bash bench/broker-cpu.sh
#
# Bounded: each round at most 120 s; the broker is killed and its directory removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
H=scripts/kafka/kafka-harness.sh
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-29092}
run=$(mktemp -d)
trap 'KAFKA_HARNESS_RUN=$run bash $H stop-all >/dev/null 2>&1 || true; rm -rf "$run"' EXIT
export KAFKA_HARNESS_RUN=$run KAFKA_HARNESS_READY=log
bash $H fetch >/dev/null
clk=$(getconf CLK_TCK)
one() {  # one MODE: prints "ready_s cpu_s"
  local t0 t1 pid ut st
  t0=$(date +%s.%N)
  KAFKA_HARNESS_BROKER_JVM=$1 bash $H start cpu "$PORT" >/dev/null 2>&1
  t1=$(date +%s.%N)
  pid=$(cat "$run/cpu/broker.pid")
  bash $H tool topics --bootstrap-server "127.0.0.1:$PORT" --create --topic t --partitions 6 >/dev/null 2>&1
  bash $H tool producer-perf-test --topic t --num-records 50000 --record-size 500 --throughput -1 \
    --producer-props "bootstrap.servers=127.0.0.1:$PORT" >/dev/null 2>&1
  sleep 20
  read -r ut st < <(awk '{ print $14, $15 }' "/proc/$pid/stat")
  bash $H stop --kill cpu >/dev/null 2>&1
  awk -v r="$(echo "$t1 - $t0" | bc)" -v c="$(( (ut + st) ))" -v k="$clk" 'BEGIN { printf "%.1f %.2f\n", r, c / k }'
}
for mode in full light; do : >"$run/$mode.txt"; done
for i in $(seq 1 "$ROUNDS"); do
  for mode in full light; do
    timeout 120 bash -c "$(declare -f one); H=$H PORT=$PORT run=$run clk=$clk one $mode" >>"$run/$mode.txt"
    echo "round $i $mode: ready s, CPU s: $(tail -1 "$run/$mode.txt")"
  done
done
median() { sort -n | awk '{ v[NR] = $1 } END { printf "%.2f (%.2f-%.2f)", v[int((NR + 1) / 2)], v[1], v[NR] }'; }
for mode in full light; do
  echo "broker $mode: CPU s $(cut -d' ' -f2 "$run/$mode.txt" | median), ready s $(cut -d' ' -f1 "$run/$mode.txt" | median), $ROUNDS rounds"
done
