#!/usr/bin/env bash
# Backlog replication, kmirror next to MirrorMaker 2 (first increment of issue 7's bench).
# Loads a source cluster with the Java producer perf test (one uncompressed and one lz4 topic),
# then replicates the backlog into a fresh target with kmirror (release build) and with MM2
# (dedicated mode, tuned as its docs advise), each until the target's end offsets match, and
# prints wall time, MB/s, the replicator's CPU seconds (user+sys), CPU-s/GB and peak RSS.
#
# Usage: bench/mirror-bench.sh            RECORDS=400000 SIZE=1024 PARTITIONS=8 ROUNDS=1
#        QUICK=1 bench/mirror-bench.sh    CI's regression guard (well under 2 minutes): kmirror only,
#                                         next to the Java producer writing the same data straight
#                                         into a target; fails if kmirror is slower than a third
#                                         of that or its peak RSS is above 200 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK="${QUICK:-0}"
if [[ $QUICK == 1 ]]; then RECORDS="${RECORDS:-200000}" PARTITIONS="${PARTITIONS:-4}"; fi
RECORDS="${RECORDS:-400000}" SIZE="${SIZE:-1024}" PARTITIONS="${PARTITIONS:-8}" ROUNDS="${ROUNDS:-1}"
H=scripts/kafka/kafka-harness.sh
export KAFKA_HARNESS_RUN="${TMPDIR:-/tmp}/kmirror-bench-$$"
trap 'bash $H stop-all >/dev/null 2>&1; rm -rf "$KAFKA_HARNESS_RUN"' EXIT
bash $H fetch >/dev/null
cargo build -q --release --bin kmirror
K=./target/release/kmirror
CLK=$(getconf CLK_TCK)

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick() { local p; for p in $(seq "$1" 2 "$2"); do if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi; done; exit 1; }
PS=$(pick 19692 19790)
bash $H start src "$PS" >/dev/null
tool() { bash $H tool "$@" 2>/dev/null; }
half=$((RECORDS / 2))
for t in plain:none lz4:lz4; do
  topic=${t%%:*} codec=${t##*:}
  tool topics --bootstrap-server "127.0.0.1:$PS" --create --topic "$topic" --partitions "$PARTITIONS" --replication-factor 1 >/dev/null
  tool producer-perf-test --topic "$topic" --num-records "$half" --record-size "$SIZE" --throughput -1 \
    --producer-props bootstrap.servers="127.0.0.1:$PS" compression.type="$codec" linger.ms=20 batch.size=262144 acks=1 \
    | tail -1 | sed "s/^/load $topic: /"
done
MB=$(awk -v r="$RECORDS" -v s="$SIZE" 'BEGIN { printf "%.1f", r * s / 1e6 }')

ends() {  # ends PORT -> total end offset of A.plain and A.lz4
  tool get-offsets --bootstrap-server "127.0.0.1:$1" 2>/dev/null | awk -F: '$1 == "A.plain" || $1 == "A.lz4" { s += $3 } END { print s + 0 }'
}
cpu_rss() {  # cpu_rss PID -> "cpu_seconds peak_rss_mb" (children included: MM2 runs in one JVM)
  local pid=$1 t
  t=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
  echo "$(awk -v t="$t" -v c="$CLK" 'BEGIN { printf "%.1f", t / c }') $(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status")"
}
config() {  # config TARGET_PORT
  cat <<EOF
clusters = A, B
A.bootstrap.servers = 127.0.0.1:$PS
B.bootstrap.servers = 127.0.0.1:$1
A->B.enabled = true
A->B.topics = plain, lz4
B->A.enabled = false
emit.heartbeats.enabled = false
emit.checkpoints.enabled = false
sync.topic.acls.enabled = false
replication.factor = 1
offset.storage.replication.factor = 1
config.storage.replication.factor = 1
status.storage.replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
# MM2 tuning (its docs): tasks, producer batching, fetch sizes. kmirror reads the same keys.
tasks.max = $(nproc)
B.producer.batch.size = 262144
B.producer.linger.ms = 20
A.consumer.fetch.max.bytes = 52428800
A.consumer.max.partition.fetch.bytes = 10485760
A.consumer.max.poll.records = 5000
EOF
}
results=()
run_one() {  # run_one TOOL ROUND
  local tool=$1 round=$2 port pid t0 t1 cfg
  port=$(pick 19792 19890)
  bash $H start "dst-$tool-$round" "$port" >/dev/null
  cfg="$KAFKA_HARNESS_RUN/$tool-$round.properties"
  config "$port" >"$cfg"
  t0=$(date +%s.%N)
  if [[ $tool == kmirror ]]; then
    $K run "$cfg" --metrics-address off --log-level warn >"$KAFKA_HARNESS_RUN/$tool-$round.log" 2>&1 &
    pid=$!
  else
    bash $H mm2 -d "mm2-$round" "$cfg" >/dev/null
    pid=$(cat "$KAFKA_HARNESS_RUN/mm2-$round/mm2.pid")
  fi
  local stats=""
  # kmirror verify (exit 0: every record is there) answers in a fraction of a second; the Java
  # get-offsets tool needs a JVM start per look, too slow for the quick run.
  if [[ $QUICK == 1 ]]; then
    until $K verify "$cfg" >/dev/null 2>&1; do stats=$(cpu_rss "$pid"); sleep 0.1; done
  else
    until [[ "$(ends "$port")" -ge "$RECORDS" ]]; do
      stats=$(cpu_rss "$pid")
      sleep 0.5
    done
  fi
  t1=$(date +%s.%N)
  stats=$(cpu_rss "$pid")
  if [[ $tool == kmirror ]]; then kill -TERM "$pid"; wait "$pid" || true; else bash $H stop "mm2-$round" >/dev/null; fi
  bash $H stop "dst-$tool-$round" >/dev/null
  local wall cpu rss
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  read -r cpu rss <<<"$stats"
  results+=("$(printf '%-8s %5s %8s s %8.1f MB/s %10.0f rec/s %8s s %10.1f %8s MB' "$tool" "$round" "$wall" \
    "$(awk -v m="$MB" -v w="$wall" 'BEGIN { print m / w }')" "$(awk -v r="$RECORDS" -v w="$wall" 'BEGIN { print r / w }')" \
    "$cpu" "$(awk -v c="$cpu" -v m="$MB" 'BEGIN { print c / (m / 1000) }')" "$rss")")
}
if [[ $QUICK == 1 ]]; then
  # The limit: the same perf test writing the same data straight into a fresh target.
  port=$(pick 19792 19890)
  bash $H start direct "$port" >/dev/null
  direct=0
  for t in plain:none lz4:lz4; do
    topic=${t%%:*} codec=${t##*:}
    tool topics --bootstrap-server "127.0.0.1:$port" --create --topic "$topic" --partitions "$PARTITIONS" --replication-factor 1 >/dev/null
    line=$(tool producer-perf-test --topic "$topic" --num-records "$half" --record-size "$SIZE" --throughput -1 \
      --producer-props bootstrap.servers="127.0.0.1:$port" compression.type="$codec" linger.ms=20 batch.size=262144 acks=all | tail -1)
    echo "direct $topic: $line"
    direct=$(awk -v d="$direct" -v l="$line" 'BEGIN { split(l, a, "[(]"); split(a[2], b, " "); print d + b[1] / 2 }')
  done
  bash $H stop direct >/dev/null
  run_one kmirror 1
  echo
  printf '%s\n' "${results[@]}"
  read -r _ _ wall _ mbs _ <<<"${results[0]}"
  rss=$(awk '{ print $(NF - 1) }' <<<"${results[0]}")
  echo "quick bench: kmirror $mbs MB/s (wall $wall s incl. start-up), direct produce $direct MB/s (mean of the two topics), kmirror peak RSS $rss MB"
  ok=1
  if awk -v k="$mbs" -v d="$direct" 'BEGIN { exit !(k < d / 3) }'; then echo "REGRESSION: kmirror is slower than a third of the direct-produce baseline"; ok=0; fi
  if awk -v r="$rss" 'BEGIN { exit !(r > 200) }'; then echo "REGRESSION: kmirror's peak RSS is above 200 MB"; ok=0; fi
  [[ $ok == 1 ]] || exit 1
  echo "quick bench: within bounds"
  exit 0
fi
for round in $(seq 1 "$ROUNDS"); do
  run_one kmirror "$round"
  run_one mm2 "$round"
done
echo
echo "backlog: $RECORDS records of $SIZE bytes ($MB MB), $PARTITIONS partitions x 2 topics (none, lz4); $(nproc) cores; $(date -u +%F)"
echo "tool     round     wall        throughput         records/s       cpu   cpu-s/GB   peak RSS"
printf '%s\n' "${results[@]}"
echo "(wall time includes each tool's start-up; MM2's CPU and RSS are its JVM's)"
