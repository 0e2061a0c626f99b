#!/usr/bin/env bash
# Runs kmirror's cargo-fuzz targets (fuzz/), each for a bounded time under a memory
# limit, from the committed corpus; new inputs the fuzzer finds go into the corpus directory.
#
#   bash scripts/fuzz.sh                    every target, 60 s each (FUZZ_SECONDS)
#   FUZZ_SECONDS=3600 bash scripts/fuzz.sh record_batches records_section
#   bash scripts/fuzz.sh --list             the targets
#
# Limits: libFuzzer's -rss_limit_mb (FUZZ_RSS_MB, default 1024) and -malloc_limit_mb
# (FUZZ_MALLOC_MB, default 64): the targets decode within a 1 MiB bound, so one allocation
# beyond 64 MiB is a bug, reported as a crash with its input under fuzz/artifacts/<target>/.
# A crash makes the script exit non-zero after the remaining targets ran.
# Needs the nightly toolchain (rustup toolchain install nightly) and cargo-fuzz, which the
# script installs with `cargo install cargo-fuzz --locked` when it is missing.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${FUZZ_SECONDS:-60}
rss_mb=${FUZZ_RSS_MB:-1024}
malloc_mb=${FUZZ_MALLOC_MB:-64}
all=(record_batches records_section mm2_formats java_regex config_text)

if [[ "${1:-}" == --list ]]; then
  printf '%s\n' "${all[@]}"
  exit 0
fi
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: the nightly toolchain is missing (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz"
  cargo +nightly install cargo-fuzz --locked
fi

failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "fuzz.sh: $t for ${seconds}s (rss ${rss_mb} MiB, one allocation at most ${malloc_mb} MiB)"
  start=$SECONDS
  # timeout: libFuzzer's own limit does not count the build, nor a hang in one input. With
  # pipefail, a crash (libFuzzer exits non-zero) fails the pipeline despite the tail.
  if ! timeout $((seconds + 900)) cargo +nightly fuzz run "$t" "corpus/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -malloc_limit_mb="$malloc_mb" \
    -timeout=10 -print_final_stats=1 2>&1 | tail -n 25; then
    failed+=("$t")
  fi
  echo "fuzz.sh: $t done in $((SECONDS - start))s, corpus $(find "corpus/$t" -type f | wc -l) inputs"
done
if ((${#failed[@]})); then
  echo "fuzz.sh: crashes or errors in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: no crash in ${targets[*]}"
