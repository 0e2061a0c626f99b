#!/usr/bin/env bash
# A new user's first large run, bounded: TOPICS topics of PARTITIONS partitions, PER_PARTITION
# records written to each partition by number, a single-node source and a fresh single-node
# target, one `kmirror run` with a minimal config (the flow's default group, no tuning).
# Prints the time from kmirror's start to the first and to the last record on the target, its
# peak RSS, its WARN lines, and what `/status` says at the end; when the target is still
# missing records after TIMEOUT seconds it also lists the target partitions still empty and
# fails (exit 1). Also prints `kmirror status` STATUS_AT (15) seconds after the start, while
# partitions still wait. Not part of CI: at the default 10,000 partitions it takes minutes.
# With RESTART=1 it then stops kmirror (SIGTERM), writes PER_PARTITION more records into every
# partition and starts it again, the target's topics in place, and prints the time from that
# start to the first and to the last new record on the target.
#
# Usage: scripts/scale-check.sh        TOPICS=100 PARTITIONS=100 PER_PARTITION=5 TIMEOUT=600
#        SOURCE_HEAP=1g TARGET_HEAP=512m   the brokers' heaps
#        KMIRROR_BIN=/tmp/old-kmirror scripts/scale-check.sh   another build (before/after)
#        TOPICS=10 RESTART=1 scripts/scale-check.sh   1,000 partitions, then a restart
#        WRAP="heaptrack -o /tmp/scale" scripts/scale-check.sh   kmirror under a profiler (ended
#          with SIGTERM once every record arrived, so the profiler writes its data)
# The cluster's shape (scripts/scale-shapes.sh runs several):
#        CREATE=java|rdkafka   the client that creates the topics and writes the records: the
#          Java admin client and producer (bench/Load.java: creates up to 5,000 partitions per
#          request and waits until every partition's log answers before writing) or librdkafka
#          (scripts/kafka/rdkafka_load.py: PER_REQUEST topics per request, returns once the
#          controller accepted them, one producer with linger.ms=50)
#        PER_REQUEST=10        topics per CreateTopics request with CREATE=rdkafka
#        PREFIX=scale-         topic names PREFIX0 ... PREFIX<TOPICS-1>
#        FILTER='scale-.*'     the flow's topics key
#        RF_KEYS=all|some      replication-factor keys: all seven, or those a user copies from a
#          short example (no config/status storage keys, emit.checkpoints.enabled = false)
#        IDLE=20               seconds kmirror's CPU is sampled once everything is copied (0: not)
#        BARE=0                skip the bare producer's floor (printed before the copy: the time a
#          plain producer needs to land one record in each of as many new partitions, on a fresh
#          broker with the target's heap, started for it and stopped after)
#        SHAPE=issue           the shape a user reported copying half of 10,000 partitions:
#          CREATE=rdkafka PER_REQUEST=10 PREFIX=s FILTER='s.*' RF_KEYS=some TARGET_HEAP=1g
set -euo pipefail
cd "$(dirname "$0")/.."
TOPICS="${TOPICS:-100}" PARTITIONS="${PARTITIONS:-100}" PER_PARTITION="${PER_PARTITION:-5}"
TIMEOUT="${TIMEOUT:-600}"
# The target runs on the harness's default heap, as a first try would; the source holds the
# partitions twice over (the data and the fetch sessions) and gets more.
if [[ "${SHAPE:-}" == issue ]]; then
  CREATE="${CREATE:-rdkafka}" PER_REQUEST="${PER_REQUEST:-10}" PREFIX="${PREFIX:-s}"
  FILTER="${FILTER:-s.*}" RF_KEYS="${RF_KEYS:-some}" TARGET_HEAP="${TARGET_HEAP:-1g}"
elif [[ -n "${SHAPE:-}" ]]; then
  echo "scale-check: unknown SHAPE '$SHAPE' (issue, or set CREATE, PREFIX, FILTER, RF_KEYS, heaps)" >&2
  exit 2
fi
SOURCE_HEAP="${SOURCE_HEAP:-1g}" TARGET_HEAP="${TARGET_HEAP:-512m}"
CREATE="${CREATE:-java}" PER_REQUEST="${PER_REQUEST:-10}" PREFIX="${PREFIX:-scale-}"
FILTER="${FILTER:-${PREFIX}.*}" RF_KEYS="${RF_KEYS:-all}"
case "$CREATE" in java | rdkafka) ;; *) echo "scale-check: CREATE is java or rdkafka, not '$CREATE'" >&2; exit 2 ;; esac
case "$RF_KEYS" in all | some) ;; *) echo "scale-check: RF_KEYS is all or some, not '$RF_KEYS'" >&2; exit 2 ;; esac
H=scripts/kafka/kafka-harness.sh
export KAFKA_HARNESS_RUN="${TMPDIR:-/tmp}/kmirror-scale-$$"
KPID=""
cleanup() {
  [[ -n "$KPID" ]] && kill -9 "$KPID" 2>/dev/null
  bash $H stop-all >/dev/null 2>&1
  [[ -n "${KEEP_RUN:-}" ]] || rm -rf "$KAFKA_HARNESS_RUN"
}
trap cleanup EXIT
bash $H fetch >/dev/null
[[ -n "${KMIRROR_BIN:-}" ]] || cargo build -q --release --bin kmirror
K=${KMIRROR_BIN:-./target/release/kmirror}
mkdir -p "$KAFKA_HARNESS_RUN"
CP="$KAFKA_HARNESS_RUN/classes:$(bash $H classpath)"
javac -nowarn -d "$KAFKA_HARNESS_RUN/classes" -cp "$CP" bench/WaitEnds.java bench/Load.java bench/BareCost.java

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick() { local p; for p in $(seq "$1" 2 "$2"); do if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi; done; exit 1; }
now_ms() { date +%s%3N; }
PS=$(pick 19592 19640)
KAFKA_HEAP=$SOURCE_HEAP bash $H start src "$PS" >/dev/null
PT=$(pick $((PS + 2)) 19690)
KAFKA_HEAP=$TARGET_HEAP bash $H start dst "$PT" >/dev/null
MP=$(pick 19900 19950)

topics="" remote=""
for i in $(seq 0 $((TOPICS - 1))); do topics+="$PREFIX$i,"; remote+="A.$PREFIX$i,"; done
topics=${topics%,} remote=${remote%,}
records=$((TOPICS * PARTITIONS * PER_PARTITION))
how=$CREATE
[[ $CREATE == rdkafka ]] && how+=" ($PER_REQUEST topics per request)"
echo "scale-check: $TOPICS topics x $PARTITIONS partitions, $PER_PARTITION records each ($records);" \
  "created by $how, filter '$FILTER', replication keys $RF_KEYS, heaps $SOURCE_HEAP/$TARGET_HEAP"
load() { # load [--create-partitions P]: write PER_PARTITION records into every partition
  if [[ $CREATE == java ]]; then
    java -cp "$CP" Load --bootstrap "127.0.0.1:$PS" --topics "$topics" "$@" \
      --every-partition "$PARTITIONS" --records "$records" --size 100
  else
    bash $H rdkafka-load --bootstrap "127.0.0.1:$PS" --topics "$topics" "$@" --per-request "$PER_REQUEST" \
      --every-partition "$PARTITIONS" --per-partition "$PER_PARTITION" --size 100 --linger-ms 50
  fi
}
load --create-partitions "$PARTITIONS"

# The floor: what a target broker itself needs before a record lands in each of as many
# partitions, created the way kmirror creates remote topics, by a plain Java producer and no
# replicator (bench/BareCost.java), on a fresh broker of the target's heap (stopped after).
if [[ ${BARE:-1} == 1 ]]; then
  PB=$(pick $((PT + 2)) 19790)
  KAFKA_HEAP=$TARGET_HEAP bash $H start bare "$PB" >/dev/null
  bare=""
  for i in $(seq 0 $((TOPICS - 1))); do bare+="bare-$i,"; done
  java -cp "$CP" BareCost --bootstrap "127.0.0.1:$PB" --topics "${bare%,}" --partitions "$PARTITIONS" |
    sed -E 's/^bare first_s=([0-9.]+) last_s=([0-9.]+) created_s=([0-9.]+)/scale-check: bare producer, fresh broker of the target heap: first record \1 s, last record \2 s (topics created in \3 s)/'
  bash $H stop --kill bare >/dev/null
fi

cfg="$KAFKA_HARNESS_RUN/kmirror.properties"
cat >"$cfg" <<EOF
clusters = A, B
A.bootstrap.servers = 127.0.0.1:$PS
B.bootstrap.servers = 127.0.0.1:$PT
A->B.enabled = true
A->B.topics = $FILTER
replication.factor = 1
offset.storage.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
checkpoints.topic.replication.factor = 1
EOF
if [[ $RF_KEYS == all ]]; then
  printf '%s\n' "config.storage.replication.factor = 1" "status.storage.replication.factor = 1" >>"$cfg"
else
  echo "emit.checkpoints.enabled = false" >>"$cfg"
fi
out="$KAFKA_HARNESS_RUN/wait"
java -cp "$CP" WaitEnds --bootstrap "127.0.0.1:$PT" --topics "$remote" --records "$records" \
  --timeout-seconds "$TIMEOUT" >"$out" 2>"$out.err" &
wpid=$!
sleep 1
t0=$(now_ms)
log="$KAFKA_HARNESS_RUN/kmirror.log"
${WRAP:-} $K run "$cfg" --metrics-address "127.0.0.1:$MP" ${LOG_LEVEL:+--log-level "$LOG_LEVEL"} >"$log" 2>&1 &
KPID=$!
# What a user sees while partitions wait for their target's logs: lag, not "caught up".
(sleep "${STATUS_AT:-15}"; $K status --address "127.0.0.1:$MP" >"$KAFKA_HARNESS_RUN/status-early" 2>&1) &
ok=1
wait "$wpid" || ok=0
echo "scale-check: status ${STATUS_AT:-15} s after the start:"
cat "$KAFKA_HARNESS_RUN/status-early" 2>/dev/null || true
kpid=$(pgrep -n -f -- "$K run $cfg" || echo "$KPID")
rss=$(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$kpid/status")
# CPU while every partition is idle (all copied): IDLE seconds of utime + stime, as % of a core.
idle=""
if [[ $ok == 1 && ${IDLE:-20} -gt 0 ]]; then
  ticks() { awk '{ print $14 + $15 }' "/proc/$kpid/stat"; }
  c0=$(ticks) t0i=$(now_ms)
  sleep "${IDLE:-20}"
  c1=$(ticks) t1i=$(now_ms)
  idle=$(awk -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" -v ms="$((t1i - t0i))" 'BEGIN { printf "%.1f", 100 * c / hz / (ms / 1000) }')
fi
echo "scale-check: status at the end:"
$K status --address "127.0.0.1:$MP" || true
if [[ -n "${WRAP:-}" ]]; then
  kill -TERM "$(pgrep -n -f -- "$K run $cfg")" 2>/dev/null || true
  wait "$KPID" || true
  KPID=""
fi
echo "scale-check: WARN lines: $(grep -c ' WARN ' "$log" || true), ERROR lines: $(grep -c ' ERROR ' "$log" || true)"
grep ' WARN ' "$log" | sed -E 's/.*WARN //; s/(topic|partition|error)=[^ ]*//g' | sort | uniq -c | sort -rn | head -5 || true
if [[ $ok == 1 ]]; then
  first=$(sed -n 's/.*first_ms=\([0-9]*\).*/\1/p' "$out") done=$(sed -n 's/.*epoch_ms=\([0-9]*\).*/\1/p' "$out")
  awk -v f="$first" -v d="$done" -v t="$t0" -v r="$rss" \
    'BEGIN { printf "scale-check: first record %.1f s, last record %.1f s, peak RSS %s MB\n", (f - t) / 1000, (d - t) / 1000, r }'
  [[ -n "$idle" ]] && echo "scale-check: idle CPU ${idle} % of a core over ${IDLE:-20} s, every partition copied"
  if [[ ${RESTART:-0} == 1 ]]; then
    kill -TERM "$KPID"
    wait "$KPID" || true
    KPID=""
    load >/dev/null
    java -cp "$CP" WaitEnds --bootstrap "127.0.0.1:$PT" --topics "$remote" --records $((records * 2)) \
      --baseline "$records" --timeout-seconds "$TIMEOUT" >"$out" 2>"$out.err" &
    wpid=$!
    sleep 1
    t0=$(now_ms)
    $K run "$cfg" --metrics-address "127.0.0.1:$MP" >>"$log" 2>&1 &
    KPID=$!
    if wait "$wpid"; then
      first=$(sed -n 's/.*first_ms=\([0-9]*\).*/\1/p' "$out") done=$(sed -n 's/.*epoch_ms=\([0-9]*\).*/\1/p' "$out")
      awk -v f="$first" -v d="$done" -v t="$t0" \
        'BEGIN { printf "scale-check: after a restart, first new record %.1f s, last %.1f s\n", (f - t) / 1000, (d - t) / 1000 }'
    else
      echo "scale-check: FAILED: not every new record on the target $TIMEOUT s after the restart: $(cat "$out.err")"
      exit 1
    fi
  fi
else
  echo "scale-check: FAILED: not every record on the target after $TIMEOUT s: $(cat "$out.err")"
  empty=$(bash $H tool get-offsets --bootstrap-server "127.0.0.1:$PT" --topic-partitions "A\\.$PREFIX.*" 2>/dev/null |
    awk -F: '$3 == 0 { print $1 }' | sort | uniq -c | sort -k2 -V | awk '{ printf "%s(%s) ", $2, $1 }')
  echo "scale-check: empty target partitions by topic: ${empty:-none}"
  echo "scale-check: peak RSS $rss MB"
  exit 1
fi
