#!/usr/bin/env bash
# The chaos soak: 3-broker source and target clusters behind fault proxies, a
# producer writing per-key sequence numbers, kmirror copying, and random faults (broker kill -9
# and restart, leader moves, a broker black-holed for 30 s, connection resets, kmirror kill -9
# and SIGSTOP) for a bounded time; then an auditor reports every lost record (the run fails on
# any) and every duplicate. The test is crates/cli/tests/serial/real_kafka_soak.rs; the suite runs it
# with 90 s of faults.
#
#   bash scripts/soak.sh              20 minutes of faults
#   bash scripts/soak.sh 3600         an hour
#   KMIRROR_SOAK_SEED=N bash scripts/soak.sh   repeat the fault sequence of a run (printed)
#
# The whole run is bounded: the fault phase, plus 15 minutes for start, catch-up and audit.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-1200}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "soak.sh: SECONDS must be a number, got '$seconds'" >&2; exit 2; }
bash scripts/kafka/kafka-harness.sh fetch >/dev/null
cargo build --tests -p kmirror-cli
KMIRROR_SOAK_SECONDS="$seconds" timeout $((seconds + 900)) \
  cargo test -p kmirror-cli --test serial real_kafka_soak -- --nocapture 2>&1 |
  grep --line-buffered -E '^soak:|^test |panicked|^test result'
exit "${PIPESTATUS[0]}"
