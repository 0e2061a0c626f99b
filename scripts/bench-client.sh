#!/usr/bin/env bash
# Client micro-benchmark: kmirror's produce/fetch vs Java's perf tools on one local broker.
# Usage: scripts/bench-client.sh [records] [record_bytes]   (defaults: 200000 1024)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/kafka/kafka-harness.sh fetch
cargo run -q --release -p kmirror-kafka --example client_bench -- "$@"
