#!/usr/bin/env bash
# kmirror next to MirrorMaker 2, side by side, on one machine.
#
# One run:
# 1. starts a source cluster with the harness and loads it with the Java producer perf test:
#    a large-record case (RECORDS records of SIZE bytes over two topics of PARTITIONS partitions,
#    one uncompressed, one lz4, linger 20 ms and 256 KiB batches) and a small-record case
#    (SMALL_RECORDS of SMALL_SIZE bytes, same layout); with bench/Load.java (one Java producer on
#    default settings) a many-partition case (MANY_RECORDS of MANY_SIZE bytes over MANY_TOPICS
#    topics of MANY_PARTITIONS partitions, half of the topics lz4, keyless, so the default
#    partitioner's 16 KiB batches) and a keyed case (KEYED_RECORDS of KEYED_SIZE bytes with
#    KEYED_KEYS keys over 2 topics of KEYED_PARTITIONS partitions, zstd, linger.ms 5, so small
#    compressed batches in every partition); the schemas cases (not by default) load the keyed
#    shape again with values in the Confluent wire format naming a schema of a source registry
#    (Apicurio), copied by kmirror with schema sync into a target registry that gives the schema
#    another id (`schemas`: every record rewritten) or the same (`schemas-same`: ids checked only);
# 2. per round (ROUNDS, the tools' order alternating): replicates each case's backlog into a
#    fresh target with kmirror and with MirrorMaker 2 in dedicated mode (and the lz4 topic
#    alone, for its CPU per GB), tuned as its docs
#    advise (tasks.max = cores, producer batch.size and linger.ms raised, fetch sizes raised),
#    until the target's end offsets hold every record (bench/WaitEnds.java, polling every
#    100 ms); kmirror once more with batch mode off (record mode, as transforms need); the same
#    perf test writing the large case straight into a fresh target (the limit); and the
#    end-to-end latency of each tool at LAT_RATE records/s for LAT_SECONDS s
#    (bench/LatencyProbe.java: source send time to target append time);
# 3. prints every run, then medians with min-max and the ratios kmirror/MM2.
#
# Usage: bench/mirror-bench.sh     RECORDS=2000000 SIZE=1024 SMALL_RECORDS=5000000 SMALL_SIZE=100
#                                  PARTITIONS=8 ROUNDS=3 LAT_RATE=5000 LAT_SECONDS=60
#                                  MANY_RECORDS=2000000 MANY_SIZE=100 MANY_TOPICS=20 MANY_PARTITIONS=50
#                                  KEYED_RECORDS=2000000 KEYED_SIZE=200 KEYED_KEYS=100000 KEYED_PARTITIONS=100
#        CASES="large many" EXTRAS="latency" bench/mirror-bench.sh   a subset (before/after runs):
#                                  CASES of large lz4 small many keyed schemas schemas-same,
#                                  EXTRAS of record direct latency scale
#        CASES= EXTRAS=scale bench/mirror-bench.sh   scale figures only: SCALE_TOPICS x SCALE_PARTITIONS
#                                  (100 x 100 = 10,000) partitions holding SCALE_RECORDS keyed records;
#                                  per tool the time from its start to the first and to the last record on
#                                  a fresh target, its CPU while every partition is idle (IDLE_SECONDS,
#                                  as % of one core) and its peak RSS; a tool that has not copied
#                                  everything within SCALE_TIMEOUT s is reported, not waited for
#        TOOLS=kmirror KMIRROR_BIN=/tmp/old-kmirror bench/mirror-bench.sh   kmirror alone (another build)
#        TOOLS="kmirror-before kmirror mm2" KMIRROR_BEFORE_BIN=/tmp/old-kmirror LAT_TOOLS="kmirror-before kmirror"
#                                  bench/mirror-bench.sh   before/after and MM2 in one run, on the same data
#        TOOLS="kmirror kmirror-alone" bench/mirror-bench.sh   kmirror with sharing off (one process
#                                  serving its flows without the flow's group) next to the default
#        TOOLS="kmirror kmirror-noresume" bench/mirror-bench.sh   kmirror without looking on the target
#                                  for what was copied after a stored position next to with
#        TOOLS="kmirror kmirror-loop" bench/mirror-bench.sh   kmirror with loop prevention (producer ids
#                                  registered on the target, every source batch's producer id
#                                  checked; docs/topologies.md) next to without
#        TOOLS="kmirror kmirror-nomerge" bench/mirror-bench.sh   kmirror with small batches forwarded
#                                  one by one (kmirror.batch.merge.enabled = false) next to merging
#        TOOLS="kmirror kmirror-eos" bench/mirror-bench.sh   exactly-once (MM2's switch on:
#                                  transactions) next to at-least-once; its end is when the
#                                  committed positions cover every record (WaitEnds --positions-topic)
#        TOOLS="kmirror kmirror-x2 kmirror-eos kmirror-eos-x2" bench/mirror-bench.sh   two processes
#                                  sharing each flow next to one: CPU summed over both, the larger RSS
#        TOOLS="kmirror-eos-before kmirror-eos" KMIRROR_BEFORE_BIN=/tmp/old-kmirror bench/mirror-bench.sh
#                                  exactly-once, before/after
#        TOOLS="kmirror-eos mm2-eos" bench/mirror-bench.sh   both exactly-once (tasks.max = cores:
#                                  MM2's tasks, kmirror's slots)
#        TOOLS="kmirror kmirror-legacy" bench/mirror-bench.sh   MM1 mode (`kmirror legacy`, Java's
#                                  partitioner, --num.streams = cores, producer tuned as the
#                                  others) next to MM2 mode; it writes the source topic names
#        LATENCY_ONLY=1 [TOOLS="kmirror mm2"] bench/mirror-bench.sh   only the latency runs
#        LATENCY_ONLY=1 LAT_READ_COMMITTED=1 TOOLS="kmirror kmirror-eos mm2-eos" bench/mirror-bench.sh
#                                  latency as a read_committed consumer sees it (the *-eos tools always are)
#        PRECREATE=0 bench/mirror-bench.sh   the tools create the remote topics (by default they
#                                  exist, every partition led, before a tool starts)
#        QUICK=1 bench/mirror-bench.sh   CI's regression guard (well under 2 minutes): kmirror only,
#                                  next to the Java producer writing the same data straight into
#                                  a target; fails if kmirror is slower than a third of that or
#                                  its peak RSS is above 200 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK="${QUICK:-0}"
# scale TOOL ROUND: the scale topics into a fresh target; appends a row
#   scale - TOOL ROUND first_s last_s idle_cpu_pct rss_MB (first_s/last_s "-" when not reached)
scale_topics() { local i; for i in $(seq 0 $((SCALE_TOPICS - 1))); do printf 'scale-%s, ' "$i"; done | sed 's/, $//'; }
scale() {
  local tool=$1 round=$2 name port cfg out t0 first done c0 c1 rss idle
  name="$tool-scale-$round"
  port=$(pick 19792 19890)
  KAFKA_HEAP=1g bash $H start "dst-$name" "$port" >/dev/null
  cfg="$KAFKA_HARNESS_RUN/$name.properties"
  config "$port" "$(scale_topics)" plain >"$cfg"
  out="$KAFKA_HARNESS_RUN/$name.wait"
  java -cp "$CP" WaitEnds --bootstrap "127.0.0.1:$port" --topics "$(echo "A.$(scale_topics)" | sed 's/, /,A./g')" \
    --records "$SCALE_RECORDS" --timeout-seconds "$SCALE_TIMEOUT" >"$out" 2>"$out.err" &
  local wpid=$!
  sleep 1
  t0=$(now_ms)
  start_tool "$tool" "$cfg" "$name"
  if wait "$wpid"; then
    first=$(sed -n 's/.*first_ms=\([0-9]*\).*/\1/p' "$out") done=$(sed -n 's/.*epoch_ms=\([0-9]*\).*/\1/p' "$out")
    # Settled (positions stored, the last produces answered), then idle.
    sleep 10
    c0=$(awk '{ print $14 + $15 }' "/proc/$KPID/stat")
    sleep "$IDLE_SECONDS"
    c1=$(awk '{ print $14 + $15 }' "/proc/$KPID/stat")
    idle=$(awk -v a="$c0" -v b="$c1" -v c="$CLK" -v s="$IDLE_SECONDS" 'BEGIN { printf "%.2f", (b - a) / c / s * 100 }')
    first=$(awk -v f="$first" -v t="$t0" 'BEGIN { printf "%.1f", (f - t) / 1000 }')
    done=$(awk -v d="$done" -v t="$t0" 'BEGIN { printf "%.1f", (d - t) / 1000 }')
  else
    echo "bench: $tool did not copy the scale topics within $SCALE_TIMEOUT s: $(cat "$out.err")" >&2
    first=- done=- idle=-
  fi
  rss=$(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$KPID/status")
  stop_tool "$tool" "$name"
  bash $H stop "dst-$name" >/dev/null
  printf 'scale\t-\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$round" "$first" "$done" "$idle" "$rss" | tee -a "$ROWS"
}

if [[ $QUICK == 1 ]]; then RECORDS="${RECORDS:-200000}" PARTITIONS="${PARTITIONS:-4}"; fi
RECORDS="${RECORDS:-2000000}" SIZE="${SIZE:-1024}" PARTITIONS="${PARTITIONS:-8}" ROUNDS="${ROUNDS:-3}"
SMALL_RECORDS="${SMALL_RECORDS:-5000000}" SMALL_SIZE="${SMALL_SIZE:-100}"
LAT_RATE="${LAT_RATE:-5000}" LAT_SECONDS="${LAT_SECONDS:-60}"
MANY_RECORDS="${MANY_RECORDS:-2000000}" MANY_SIZE="${MANY_SIZE:-100}" MANY_TOPICS="${MANY_TOPICS:-20}" MANY_PARTITIONS="${MANY_PARTITIONS:-50}"
KEYED_RECORDS="${KEYED_RECORDS:-2000000}" KEYED_SIZE="${KEYED_SIZE:-200}" KEYED_KEYS="${KEYED_KEYS:-100000}" KEYED_PARTITIONS="${KEYED_PARTITIONS:-100}"
SCALE_TOPICS="${SCALE_TOPICS:-100}" SCALE_PARTITIONS="${SCALE_PARTITIONS:-100}" SCALE_RECORDS="${SCALE_RECORDS:-200000}"
IDLE_SECONDS="${IDLE_SECONDS:-60}" SCALE_TIMEOUT="${SCALE_TIMEOUT:-900}"
CASES="${CASES-large lz4 small many keyed}" EXTRAS="${EXTRAS-record direct latency}"
has() { [[ " $1 " == *" $2 "* ]]; }
# many-plain-0, ..., many-lz4-0, ...: the many-partition case's topics, half of them compressed
many_topics() { local i; for i in $(seq 0 $((MANY_TOPICS / 2 - 1))); do printf 'many-%s-%s, ' "$1" "$i"; done | sed 's/, $//'; }
H=scripts/kafka/kafka-harness.sh
export KAFKA_HARNESS_RUN="${TMPDIR:-/tmp}/kmirror-bench-$$"
cleanup() {
  [[ -n "${KPID:-}" ]] && kill -9 "$KPID" ${KPID2:-} 2>/dev/null
  bash $H stop-all >/dev/null 2>&1
  [[ -n "${KEEP_RUN:-}" ]] || rm -rf "$KAFKA_HARNESS_RUN"
}
trap cleanup EXIT
bash $H fetch >/dev/null
[[ -n "${KMIRROR_BIN:-}" ]] || cargo build -q --release --bin kmirror
K=${KMIRROR_BIN:-./target/release/kmirror}  # another build, for before/after figures
CLK=$(getconf CLK_TCK)
mkdir -p "$KAFKA_HARNESS_RUN"
CP="$KAFKA_HARNESS_RUN/classes:$(bash $H classpath)"
# Compiled once, so each use starts in well under a second.
javac -nowarn -d "$KAFKA_HARNESS_RUN/classes" -cp "$CP" bench/WaitEnds.java bench/LatencyProbe.java bench/Load.java

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick() { local p; for p in $(seq "$1" 2 "$2"); do if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi; done; exit 1; }
now_ms() { date +%s%3N; }
tool() { bash $H tool "$@" 2>/dev/null; }
PS=$(pick 19692 19790)
# The scale case's source holds 11,000 partitions and serves every scale run of the bench (each
# fetching all of them, in sessions, and writing offset syncs there): with 1 GiB of heap it ran
# out in the sixth scale run of one full bench, so 2 GiB.
if has "${EXTRAS-}" scale; then KAFKA_HEAP=2g bash $H start src "$PS" >/dev/null; else bash $H start src "$PS" >/dev/null; fi

load() {  # load TOPIC CODEC RECORDS SIZE [PORT] -> the perf test's closing line
  local port=${5:-$PS}
  tool topics --bootstrap-server "127.0.0.1:$port" --create --topic "$1" --partitions "$PARTITIONS" --replication-factor 1 >/dev/null
  tool producer-perf-test --topic "$1" --num-records "$3" --record-size "$4" --throughput -1 \
    --producer-props bootstrap.servers="127.0.0.1:$port" compression.type="$2" linger.ms=20 batch.size=262144 acks=all | tail -1
}
register_schema() {  # register_schema URL SUBJECT NAME -> the id the registry answers for record NAME
  curl -sf -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
    --data "{\"schema\": \"{\\\"type\\\":\\\"record\\\",\\\"name\\\":\\\"$3\\\",\\\"fields\\\":[]}\"}" \
    "$1/subjects/$2/versions" | sed -n 's/.*"id" *: *\([0-9]*\).*/\1/p'
}
load_java() {  # load_java "T1, T2" PARTITIONS RECORDS SIZE [Load options] -> Load's closing line
  local topics=$1 partitions=$2 records=$3 size=$4
  shift 4
  java -cp "$CP" Load --bootstrap "127.0.0.1:$PS" --topics "${topics//, /,}" --create-partitions "$partitions" \
    --records "$records" --size "$size" "$@"
}
cpu_rss() {  # cpu_rss PID... -> "cpu_seconds peak_rss_mb": CPU summed, the largest peak RSS (MM2 runs in one JVM)
  local t=0 r=0 p
  for p in "$@"; do
    t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat")))
    r=$(awk -v r="$r" '/VmHWM/ { v = $2 / 1024; printf "%.0f", (v > r ? v : r) }' "/proc/$p/status")
  done
  echo "$(awk -v t="$t" -v c="$CLK" 'BEGIN { printf "%.1f", t / c }') $r"
}
config() {  # config TARGET_PORT TOPICS [tuned|plain] [extra lines]
  cat <<EOF
clusters = A, B
A.bootstrap.servers = 127.0.0.1:$PS
B.bootstrap.servers = 127.0.0.1:$1
A->B.enabled = true
A->B.topics = $2
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
tasks.max = $(nproc)
EOF
  if [[ ${3:-tuned} == tuned ]]; then
    cat <<EOF
# MM2 tuning (its docs): producer batching, fetch sizes. kmirror reads the same keys.
B.producer.batch.size = 262144
B.producer.linger.ms = 20
A.consumer.fetch.max.bytes = 52428800
A.consumer.max.partition.fetch.bytes = 10485760
A.consumer.max.poll.records = 5000
EOF
  fi
  [[ -n "${4:-}" ]] && echo "$4"
  return 0
}
# legacy_config TARGET_PORT TOPICS NAME FILE: MM1's two client files (the same tuning as the
# MM2 configuration's) and its topic regex, for the kmirror-legacy tool.
legacy_config() {
  cat >"$4" <<EOF
bootstrap.servers = 127.0.0.1:$PS
group.id = bench-$3
auto.offset.reset = earliest
fetch.max.bytes = 52428800
max.partition.fetch.bytes = 10485760
max.poll.records = 5000
EOF
  cat >"$4.producer" <<EOF
bootstrap.servers = 127.0.0.1:$1
batch.size = 262144
linger.ms = 20
EOF
  echo "$2" | sed 's/, /|/g' >"$4.include"
}
# kmirror serves its metrics endpoint as users run it (the default is on; port 0 picks a free
# one), so the figures include the cost of its metrics; KMIRROR_METRICS=off measures without.
KMIRROR_METRICS="${KMIRROR_METRICS:-127.0.0.1:0}"
start_tool() {  # start_tool TOOL CONFIG NAME -> sets KPID
  case $1 in
    kmirror | kmirror-record | kmirror-nomerge | kmirror-noresume | kmirror-alone | kmirror-eos | kmirror-loop)
      $K run "$2" --metrics-address "$KMIRROR_METRICS" --log-level "${KMIRROR_LOG_LEVEL:-warn}" >"$KAFKA_HARNESS_RUN/$3.log" 2>&1 &
      KPID=$! ;;
    kmirror-x2 | kmirror-eos-x2)  # two processes sharing the flow (its group divides the work)
      $K run "$2" --metrics-address "$KMIRROR_METRICS" --log-level "${KMIRROR_LOG_LEVEL:-warn}" >"$KAFKA_HARNESS_RUN/$3.log" 2>&1 &
      KPID=$!
      $K run "$2" --metrics-address "$KMIRROR_METRICS" --log-level "${KMIRROR_LOG_LEVEL:-warn}" >"$KAFKA_HARNESS_RUN/$3-2.log" 2>&1 &
      KPID2=$! ;;
    kmirror-before | kmirror-eos-before)  # another build of kmirror, for before/after figures in one run
      "${KMIRROR_BEFORE_BIN:?set KMIRROR_BEFORE_BIN for the kmirror-before tool}" run "$2" --metrics-address "$KMIRROR_METRICS" \
        --log-level "${KMIRROR_LOG_LEVEL:-warn}" >"$KAFKA_HARNESS_RUN/$3.log" 2>&1 &
      KPID=$! ;;
    kmirror-legacy)  # MM1 mode: CONFIG is the consumer file, CONFIG.producer and CONFIG.include beside it
      $K legacy --consumer.config "$2" --producer.config "$2.producer" --include "$(cat "$2.include")" \
        --num.streams "$(nproc)" --metrics-address "$KMIRROR_METRICS" --log-level "${KMIRROR_LOG_LEVEL:-warn}" \
        >"$KAFKA_HARNESS_RUN/$3.log" 2>&1 &
      KPID=$! ;;
    mm2 | mm2-eos)
      bash $H mm2 -d "$3" "$2" >/dev/null
      KPID=$(cat "$KAFKA_HARNESS_RUN/$3/mm2.pid") ;;
  esac
}
stop_tool() {  # stop_tool TOOL NAME
  if [[ $1 == mm2* ]]; then bash $H stop "$2" >/dev/null; else kill -TERM "$KPID" ${KPID2:-}; wait "$KPID" ${KPID2:-} || true; fi
  KPID="" KPID2=""
}

ROWS="$KAFKA_HARNESS_RUN/rows.tsv"
: >"$ROWS"
# backlog TOOL CASE ROUND: replicate one case's backlog into a fresh target; appends a row
#   backlog CASE TOOL ROUND wall_s copy_s MB/s records/s cpu_s cpu_s_per_GB rss_MB
backlog() {
  local tool=$1 case=$2 round=$3 topics records size parts name port cfg t0 out first done stats cpu rss extra=""
  case $case in
    large) topics="plain, lz4" records=$RECORDS size=$SIZE parts=$PARTITIONS ;;
    lz4) topics="lz4" records=$((RECORDS / 2)) size=$SIZE parts=$PARTITIONS ;;  # the compressed topic alone, for its CPU per GB
    small) topics="small-plain, small-lz4" records=$SMALL_RECORDS size=$SMALL_SIZE parts=$PARTITIONS ;;
    many) topics="$(many_topics plain), $(many_topics lz4)" records=$MANY_RECORDS size=$MANY_SIZE parts=$MANY_PARTITIONS ;;
    keyed) topics="keyed-0, keyed-1" records=$KEYED_RECORDS size=$KEYED_SIZE parts=$KEYED_PARTITIONS ;;
    schemas | schemas-same) topics="schemas-0, schemas-1" records=$KEYED_RECORDS size=$KEYED_SIZE parts=$KEYED_PARTITIONS ;;
  esac
  # Schema sync is kmirror's (MM2 copies the ids as they are): other tools skip these cases.
  if [[ $case == schemas* ]]; then
    [[ $tool == kmirror || $tool == kmirror-before ]] || return 0
    # A fresh target registry per run. `schemas`: schemas of its own first, so the ids differ and
    # every record is rewritten; `schemas-same`: empty, so the id maps to the same number and
    # batches go as they are (decoded to read the ids, not re-encoded).
    bash $H registry start "sr-dst-$tool-$case-$round" "$(pick 19900 19990)" >/dev/null
    local sr_dst i
    sr_dst=$(bash $H registry url "sr-dst-$tool-$case-$round")
    if [[ $case == schemas ]]; then
      for i in 1 2 3 4 5; do register_schema "$sr_dst" local-value "Local$i" >/dev/null; done
    fi
    extra="A.schema.registry.url = $SR_SRC
B.schema.registry.url = $sr_dst
kmirror.schemas.ids = translate"
  fi
  [[ $tool == kmirror-record ]] && extra="kmirror.batch.mode.enabled = false"
  [[ $tool == kmirror-nomerge ]] && extra="kmirror.batch.merge.enabled = false"
  [[ $tool == kmirror-noresume ]] && extra="kmirror.resume.from.target.enabled = false"
  [[ $tool == kmirror-alone ]] && extra="kmirror.sharing.enabled = false"
  [[ $tool == kmirror-loop ]] && extra="kmirror.loop.prevention.enabled = true"
  # Exactly-once (MM2's switch): transactions; the end is when the committed positions cover
  # every record (end offsets would count transaction markers and aborted batches).
  # Both with tasks.max = cores (config below): MM2's tasks, kmirror's slots. MM2's exactly-once
  # needs its internal REST server in dedicated mode (KIP-710), on a port of its own.
  [[ $tool == kmirror-eos || $tool == kmirror-eos-x2 || $tool == kmirror-eos-before ]] && extra="B.exactly.once.source.support = enabled"
  [[ $tool == mm2-eos ]] && extra="B.exactly.once.source.support = enabled
dedicated.mode.enable.internal.rest = true
listeners = http://127.0.0.1:$(pick 18100 18190)"
  # KMIRROR_EXTRA: more configuration lines for every kmirror tool (e.g. checkpoints on, so
  # each process publishes its runs: "emit.checkpoints.enabled = true").
  [[ $tool == kmirror* && -n ${KMIRROR_EXTRA:-} ]] && extra="$extra
$KMIRROR_EXTRA"
  name="$tool-$case-$round"
  # The remote topics' names: MM2 mode's "A." prefix, MM1 mode's source names.
  local remote
  if [[ $tool == kmirror-legacy ]]; then remote="${topics//, /,}"; else remote="$(echo "A.$topics" | sed 's/, /,A./g')"; fi
  port=$(pick 19792 19890)
  bash $H start "dst-$name" "$port" >/dev/null
  # The remote topics exist, every partition led, before the tool starts (PRECREATE=0: the
  # tool creates them): a broker creates partition logs one by one, about 40 a second here, so
  # on the many-partition case creation, not copying, would bound the copy phase of both tools.
  if [[ ${PRECREATE:-1} == 1 ]]; then
    java -cp "$CP" Load --bootstrap "127.0.0.1:$port" --topics "$remote" \
      --records 0 --size 1 --create-partitions "$parts" >/dev/null
  fi
  cfg="$KAFKA_HARNESS_RUN/$name.properties"
  if [[ $tool == kmirror-legacy ]]; then legacy_config "$port" "$topics" "$name" "$cfg"; else config "$port" "$topics" tuned "$extra" >"$cfg"; fi
  out="$KAFKA_HARNESS_RUN/$name.wait"
  local wait_mode=()
  [[ $tool == *-eos || $tool == *-eos-x2 || $tool == *-eos-before ]] && wait_mode=(--positions-topic mm2-offsets.A.internal --source-topics "${topics//, /,}")
  java -cp "$CP" WaitEnds --bootstrap "127.0.0.1:$port" --topics "$remote" \
    --records "$records" --timeout-seconds "${BACKLOG_TIMEOUT:-300}" "${wait_mode[@]}" >"$out" 2>"$out.err" &
  local wpid=$!
  sleep 1
  t0=$(now_ms)
  start_tool "$tool" "$cfg" "$name"
  stats=$(cpu_rss "$KPID" ${KPID2:-})
  while kill -0 "$wpid" 2>/dev/null; do stats=$(cpu_rss "$KPID" ${KPID2:-}); sleep 0.2; done
  if ! wait "$wpid"; then
    # Reported and recorded, not fatal: one tool failing a case (MM2 running out of heap, say)
    # must not throw away the rest of a long run.
    echo "bench: $name did not complete: $(cat "$out.err"); see $KAFKA_HARNESS_RUN/$name*" >&2
    stop_tool "$tool" "$name"
    bash $H stop "dst-$name" >/dev/null
    [[ $case == schemas* ]] && bash $H stop "sr-dst-$name" >/dev/null
    printf 'backlog\t%s\t%s\t%s\tfailed\t-\t-\t-\t-\t-\t-\n' "$case" "$tool" "$round" | tee -a "$ROWS"
    KEEP_RUN=1
    return 0
  fi
  stats=$(cpu_rss "$KPID" ${KPID2:-})
  stop_tool "$tool" "$name"
  bash $H stop "dst-$name" >/dev/null
  [[ $case == schemas* ]] && bash $H stop "sr-dst-$name" >/dev/null
  first=$(sed -n 's/.*first_ms=\([0-9]*\).*/\1/p' "$out") done=$(sed -n 's/.*epoch_ms=\([0-9]*\).*/\1/p' "$out")
  read -r cpu rss <<<"$stats"
  awk -v c="$case" -v t="$tool" -v r="$round" -v t0="$t0" -v f="$first" -v d="$done" -v n="$records" -v s="$size" -v cpu="$cpu" -v rss="$rss" \
    'BEGIN { w = (d - t0) / 1000; mb = n * s / 1e6; printf "backlog\t%s\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.0f\t%s\t%.2f\t%s\n", c, t, r, w, (d - f) / 1000, mb / w, n / w, cpu, cpu / (mb / 1000), rss }' \
    | tee -a "$ROWS"
}
# direct ROUND: the limit, the perf test writing the large case straight into a fresh target
# (both topics at once, like the replicators); MB/s from the perf tests' own elapsed times.
direct() {
  local round=$1 port a b
  port=$(pick 19792 19890)
  bash $H start "direct-$round" "$port" >/dev/null
  load plain none $((RECORDS / 2)) "$SIZE" "$port" >"$KAFKA_HARNESS_RUN/direct-a" &
  a=$!
  load lz4 lz4 $((RECORDS / 2)) "$SIZE" "$port" >"$KAFKA_HARNESS_RUN/direct-b" &
  b=$!
  wait $a $b
  bash $H stop "direct-$round" >/dev/null
  # "N records sent, R records/sec (M MB/sec), ...": each test's elapsed time is N / R.
  cat "$KAFKA_HARNESS_RUN/direct-a" "$KAFKA_HARNESS_RUN/direct-b" | awk -v r="$round" -v s="$SIZE" '
    { n += $1; e = $1 / $4; if (e > w) w = e }
    END { mb = n * s / 1e6; printf "backlog\tlarge\tdirect\t%s\t%.1f\t%.1f\t%.1f\t%.0f\t-\t-\t-\n", r, w, w, mb / w, n / w }' | tee -a "$ROWS"
}
# latency TOOL ROUND: a fresh target that stamps records with their append time, a fresh
# source topic, the tool with default producer settings, then the probe.
latency() {
  local tool=$1 round=$2 port topic cfg name line stats
  name="lat-$tool-$round" topic="lat-$tool-$round"
  port=$(pick 19792 19890)
  bash $H start "dst-$name" "$port" --prop log.message.timestamp.type=LogAppendTime >/dev/null
  tool topics --bootstrap-server "127.0.0.1:$PS" --create --topic "$topic" --partitions "$PARTITIONS" --replication-factor 1 >/dev/null
  cfg="$KAFKA_HARNESS_RUN/$name.properties"
  config "$port" "$topic" plain >"$cfg"
  start_tool "$tool" "$cfg" "$name"
  java -cp "$CP" WaitEnds --bootstrap "127.0.0.1:$port" --topics "A.$topic" --records 0 --timeout-seconds 120 >/dev/null
  line=$(java -cp "$CP" LatencyProbe --source "127.0.0.1:$PS" --target "127.0.0.1:$port" --topic "$topic" \
    --remote-topic "A.$topic" --rate "$LAT_RATE" --seconds "$LAT_SECONDS" --size 1024 \
    $([[ $tool == *-eos || $tool == *-eos-before || -n ${LAT_READ_COMMITTED:-} ]] && echo --isolation read_committed) 2>"$KAFKA_HARNESS_RUN/$name.probe.err") \
    || { echo "bench: latency probe failed for $tool: $(tail -5 "$KAFKA_HARNESS_RUN/$name.probe.err")" >&2; exit 1; }
  stats=$(cpu_rss "$KPID")
  stop_tool "$tool" "$name"
  bash $H stop "dst-$name" >/dev/null
  echo "$tool $round: $line" >&2
  echo "$line" | awk -v t="$tool" -v r="$round" -v st="$stats" '{
      for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      split(st, s, " ")
      printf "latency\t-\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t, r, v["p50"], v["p99"], v["max"], v["send_p50"], v["send_p99"], s[1], v["sent_rate"], s[2] }' | tee -a "$ROWS"
}

if [[ $QUICK == 1 ]]; then
  half=$((RECORDS / 2))
  load plain none "$half" "$SIZE" | sed "s/^/load plain: /"
  load lz4 lz4 "$half" "$SIZE" | sed "s/^/load lz4: /"
  direct 1 >/dev/null
  backlog kmirror large 1 >/dev/null
  read -r _ _ _ _ wall _ mbs _ _ _ rss < <(grep -P '^backlog\tlarge\tkmirror\t' "$ROWS")
  read -r _ _ _ _ _ _ direct_mbs _ < <(grep -P '^backlog\tlarge\tdirect\t' "$ROWS")
  echo "quick bench: kmirror $mbs MB/s (wall $wall s incl. start-up), direct produce $direct_mbs MB/s, kmirror peak RSS $rss MB"
  ok=1
  if awk -v k="$mbs" -v d="$direct_mbs" 'BEGIN { exit !(k < d / 3) }'; then echo "REGRESSION: kmirror is slower than a third of the direct-produce baseline"; ok=0; fi
  if awk -v r="$rss" 'BEGIN { exit !(r > 200) }'; then echo "REGRESSION: kmirror's peak RSS is above 200 MB"; ok=0; fi
  [[ $ok == 1 ]] || exit 1
  echo "quick bench: within bounds"
  exit 0
fi

if [[ ${LATENCY_ONLY:-0} == 1 ]]; then
  for round in $(seq 1 "$ROUNDS"); do
    if ((round % 2)); then order="${TOOLS:-kmirror mm2}"; else order="$(echo "${TOOLS:-kmirror mm2}" | awk '{ for (i = NF; i; i--) printf "%s ", $i }')"; fi
    for t in $order; do latency "$t" "$round"; done
  done
  python3 bench/summarize.py "$ROWS"
  exit 0
fi
half=$((RECORDS / 2)) small_half=$((SMALL_RECORDS / 2))
if has "$CASES" large || has "$CASES" lz4 || has "$EXTRAS" record; then
  echo "load plain: $(load plain none "$half" "$SIZE")"
  echo "load lz4: $(load lz4 lz4 "$half" "$SIZE")"
fi
if has "$CASES" small; then
  echo "load small-plain: $(load small-plain none "$small_half" "$SMALL_SIZE")"
  echo "load small-lz4: $(load small-lz4 lz4 "$small_half" "$SMALL_SIZE")"
fi
# (Assigned first, so a failed load stops the run under set -e.)
if has "$CASES" many; then
  out=$(load_java "$(many_topics plain)" "$MANY_PARTITIONS" $((MANY_RECORDS / 2)) "$MANY_SIZE")
  echo "load many-plain-*: $out"
  out=$(load_java "$(many_topics lz4)" "$MANY_PARTITIONS" $((MANY_RECORDS / 2)) "$MANY_SIZE" --compression lz4)
  echo "load many-lz4-*: $out"
fi
if has "$CASES" keyed; then
  out=$(load_java "keyed-0, keyed-1" "$KEYED_PARTITIONS" "$KEYED_RECORDS" "$KEYED_SIZE" \
    --keys "$KEYED_KEYS" --compression zstd --linger-ms 5)
  echo "load keyed-*: $out"
fi
if has "$CASES" schemas || has "$CASES" schemas-same; then
  # The keyed case's shape, each value in the Confluent wire format naming a schema registered on
  # a source registry (Apicurio; its ids are content ids, so both subjects share one).
  bash $H registry fetch >/dev/null
  bash $H registry start sr-src "$(pick 19900 19990)" >/dev/null
  SR_SRC=$(bash $H registry url sr-src)
  for t in schemas-0 schemas-1; do SCHEMA_ID=$(register_schema "$SR_SRC" "$t-value" Order); done
  out=$(load_java "schemas-0, schemas-1" "$KEYED_PARTITIONS" "$KEYED_RECORDS" "$KEYED_SIZE" \
    --keys "$KEYED_KEYS" --compression zstd --linger-ms 5 --schema-id "$SCHEMA_ID")
  echo "load schemas-*: $out (schema id $SCHEMA_ID)"
fi
if has "$EXTRAS" scale; then
  out=$(load_java "$(scale_topics)" "$SCALE_PARTITIONS" "$SCALE_RECORDS" 100 --keys 1000000)
  echo "load scale-*: $out"
fi
# Written-back before the first run, so round 1 does not share the disk with the load's pages.
sync
sleep 3
echo "kind	case	tool	round	wall_s|p50_ms	copy_s|p99_ms	MB/s|max_ms	rec/s|send_p50	cpu_s|send_p99	cpu_s/GB|cpu_s	rss_MB|rate	(rss_MB)"
for round in $(seq 1 "$ROUNDS"); do
  tools="${TOOLS:-kmirror mm2}"
  if ((round % 2)); then order="$tools"; else order="$(echo "$tools" | awk '{ for (i = NF; i; i--) printf "%s ", $i }')"; fi
  for case in $CASES; do
    for t in $order; do backlog "$t" "$case" "$round"; done
  done
  if has "$EXTRAS" record; then backlog kmirror-record large "$round"; fi
  if has "$EXTRAS" direct; then direct "$round"; fi
  if has "$EXTRAS" latency; then for t in ${LAT_TOOLS:-$order}; do latency "$t" "$round"; done; fi
  if has "$EXTRAS" scale; then for t in $order; do scale "$t" "$round"; done; fi
done
cp "$ROWS" "${BENCH_ROWS:-/tmp/mirror-bench-rows.tsv}"
echo
echo "machine: $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/Mem:/ { print $2 }') GiB; $(java -version 2>&1 | head -1); $(date -u +%F)"
echo "cases: $CASES; extras: $EXTRAS; tools: ${TOOLS:-kmirror mm2}; kmirror: $K; $ROUNDS rounds"
echo "large: $RECORDS x $SIZE B, small: $SMALL_RECORDS x $SMALL_SIZE B, $PARTITIONS partitions x 2 topics (none, lz4); latency at $LAT_RATE rec/s for $LAT_SECONDS s"
echo "scale: $SCALE_TOPICS topics x $SCALE_PARTITIONS partitions, $SCALE_RECORDS keyed records of 100 B, idle CPU over $IDLE_SECONDS s"
echo "many: $MANY_RECORDS x $MANY_SIZE B over $MANY_TOPICS topics x $MANY_PARTITIONS partitions (half lz4, keyless, producer defaults); keyed: $KEYED_RECORDS x $KEYED_SIZE B, $KEYED_KEYS keys, 2 topics x $KEYED_PARTITIONS partitions, zstd, linger.ms 5"
python3 bench/summarize.py "$ROWS"
