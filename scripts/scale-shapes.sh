#!/usr/bin/env bash
# scripts/scale-check.sh on several cluster shapes, one after another: a check that passes on one
# shape proves one shape. Each shape varies what a user's cluster may differ in: the client that
# created the topics and how many it put in one request, the target broker's heap, which
# replication keys the config names, and the topic filter. Prints one summary line per shape
# (first and last record, peak RSS, WARN lines) and fails when any shape fails or misses LIMIT
# seconds (the time from kmirror's start to the last record). Not part of CI: at the default
# 10,000 partitions each shape takes two to three minutes.
#
# Usage: scripts/scale-shapes.sh                        every shape at 100 x 100 partitions
#        TOPICS=10 LIMIT=30 scripts/scale-shapes.sh     1,000 partitions
#        SHAPES="issue java-1g" scripts/scale-shapes.sh  some of them (names below)
#        TOPICS=200 LIMIT=180 SHAPES=java-512m scripts/scale-shapes.sh   20,000 partitions
#        KMIRROR_BIN=/tmp/old-kmirror scripts/scale-shapes.sh   another build (before/after)
set -uo pipefail
set -f # the shapes hold regexes
cd "$(dirname "$0")/.."
TOPICS="${TOPICS:-100}" LIMIT="${LIMIT:-60}"
# name: the settings scale-check.sh takes.
declare -A SHAPE_OF=(
  [java-512m]="CREATE=java TARGET_HEAP=512m RF_KEYS=all"
  [issue]="SHAPE=issue"
  [rdkafka1-512m]="CREATE=rdkafka PER_REQUEST=1 TARGET_HEAP=512m RF_KEYS=all PREFIX=t FILTER=t[0-9]+"
  [rdkafka50-1g]="CREATE=rdkafka PER_REQUEST=50 TARGET_HEAP=1g RF_KEYS=some PREFIX=u FILTER=.*"
  [java-1g]="CREATE=java TARGET_HEAP=1g RF_KEYS=some PREFIX=scale- FILTER=scale-.*,other"
)
SHAPES="${SHAPES:-java-512m issue rdkafka1-512m rdkafka50-1g java-1g}"
if [[ -z "${KMIRROR_BIN:-}" ]]; then
  cargo build -q --release --bin kmirror || exit 1
fi
BIN="${KMIRROR_BIN:-./target/release/kmirror}"
summary=() failed=0
for s in $SHAPES; do
  [[ -n "${SHAPE_OF[$s]:-}" ]] || { echo "scale-shapes: unknown shape '$s' (${!SHAPE_OF[*]})" >&2; exit 2; }
  log="${TMPDIR:-/tmp}/scale-shape-$s.log"
  echo "scale-shapes: $s: ${SHAPE_OF[$s]} (log $log)"
  # shellcheck disable=SC2086 # one setting per word
  env ${SHAPE_OF[$s]} TOPICS="$TOPICS" TIMEOUT="${TIMEOUT:-$((LIMIT * 3))}" \
    KMIRROR_BIN="$BIN" bash scripts/scale-check.sh >"$log" 2>&1
  rc=$?
  line=$(grep -E 'scale-check: (first record|FAILED)' "$log" | head -1)
  floor=$(sed -n 's/^scale-check: bare producer, fresh broker of the target heap: first record \([0-9.]*\) s, last record \([0-9.]*\) s.*/bare \1 \/ \2 s/p' "$log")
  warns=$(sed -n 's/^scale-check: WARN lines: \([0-9]*\).*/\1/p' "$log")
  last=$(sed -n 's/^scale-check: first record .*, last record \([0-9.]*\) s.*/\1/p' "$log" | head -1)
  verdict=ok
  if ((rc != 0)) || [[ -z "$last" ]]; then
    verdict=FAILED
  elif awk -v l="$last" -v m="$LIMIT" 'BEGIN { exit !(l > m) }'; then
    verdict="FAILED (over $LIMIT s)"
  fi
  [[ $verdict == ok ]] || failed=1
  summary+=("$(printf '%-14s %-8s %s; WARN %s; %s' "$s" "$verdict" "${line#scale-check: }" "${warns:-?}" "${floor:-no floor}")")
  echo "scale-shapes: ${summary[-1]}"
done
echo "scale-shapes: $((TOPICS * 100)) partitions per shape, limit $LIMIT s to the last record:"
printf '  %s\n' "${summary[@]}"
exit $failed
