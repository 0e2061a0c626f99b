#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and integration tests against real Apache
# Kafka brokers started by scripts/kafka/kafka-harness.sh (jars fetched once with Maven).
set -euo pipefail
cd "$(dirname "$0")/.."

t0=$SECONDS
bash scripts/kafka/kafka-harness.sh fetch
echo "test.sh: Kafka jars ready in $((SECONDS - t0))s ($(du -sh "${KAFKA_HARNESS_CACHE:-$HOME/.cache/kafka-harness}" | cut -f1) cache)"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
echo "test.sh: all checks passed in $((SECONDS - t0))s"
