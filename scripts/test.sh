#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and integration tests against real Apache
# Kafka brokers started by scripts/kafka/kafka-harness.sh (jars fetched once with Maven).
set -euo pipefail
cd "$(dirname "$0")/.."

t0=$SECONDS
# Where the time goes: each phase's seconds, printed at the end.
phases=()
phase_start=$SECONDS
phase() { phases+=("$1 $((SECONDS - phase_start))s"); phase_start=$SECONDS; }
bash scripts/kafka/kafka-harness.sh fetch
# Class-data archives: every broker and tool JVM of the suite starts faster (optional: the
# suite runs without them if they cannot be made).
bash scripts/kafka/kafka-harness.sh cds
# The schema registry the registry tests run (Apicurio, ~160 MB, once), and the real
# serializers that write and read their records (Confluent's Python client, from PyPI, once).
bash scripts/kafka/kafka-harness.sh registry fetch
bash scripts/kafka/kafka-harness.sh serde fetch
phase "jars and class-data archives"
echo "test.sh: Kafka jars ready in $((SECONDS - t0))s ($(du -sh "${KAFKA_HARNESS_CACHE:-$HOME/.cache/kafka-harness}" | cut -f1) cache)"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# No new import cycle between modules; the count only goes down.
python3 scripts/module-cycles.py
phase "fmt and clippy"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --no-run 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
phase "test build"
# The quick benchmark's release build runs at the lowest priority while the tests run: they
# spend much of their time waiting on brokers, and the build takes only the CPU they leave
# (built after them, it added five minutes to the suite).
release_log="$(mktemp)"
trap 'rm -f "$log" "$release_log"' EXIT
nice -n 19 cargo build -q --release --bin kmirror >"$release_log" 2>&1 &
release_pid=$!
# --no-fail-fast: one failing test binary must not hide the state of the others.
cargo test --workspace --no-fail-fast 2>&1 | tee -a "$log"
run=${PIPESTATUS[0]}
if [[ $status -eq 0 ]]; then status=$run; fi
phase "tests"
# The gross-regression guard of the benchmark: kmirror against the Java producer's
# direct-produce baseline measured in the same run, and its peak RSS.
if wait "$release_pid"; then
  KMIRROR_BIN=./target/release/kmirror QUICK=1 bash bench/mirror-bench.sh 2>&1 | tee -a "$log"
  bench=${PIPESTATUS[0]}
else
  cat "$release_log" | tee -a "$log"
  echo "test.sh: the release build failed" | tee -a "$log"
  bench=1
fi
phase "release build left after the tests and quick benchmark"
if [[ $bench -ne 0 && $status -eq 0 ]]; then status=$bench; fi
set -e
# One closing line for the whole suite (cargo prints one per test binary).
sum() { grep -E '^test result:' "$log" | sed -E "s/.* ([0-9]+) $1.*/\\1/" | awk '{ s += $1 } END { print s + 0 }'; }
passed=$(sum passed)
failed=$(sum failed)
if [[ $bench -ne 0 ]]; then failed=$((failed + 1)); echo "test.sh: the quick benchmark failed (see above)"; fi
echo "test.sh: finished in $((SECONDS - t0))s ($(IFS=,; echo "${phases[*]}" | sed 's/,/, /g'))"
echo "tests: ${passed:-0} passed, ${failed:-0} failed"
# Every failed test by name, and every test binary that failed (including one that crashed or
# timed out and so printed no result line).
if [[ $status -ne 0 ]]; then
  echo "test.sh: FAILED:"
  grep -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/  \1/' | sort -u || true
  grep -E "^error: test failed, to rerun pass" "$log" | sed -E 's/^error: test failed, to rerun pass /  binary: /' | sort -u || true
  [[ $bench -ne 0 ]] && echo "  the quick benchmark (bench/mirror-bench.sh QUICK=1)"
fi
exit "$status"
