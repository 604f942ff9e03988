#!/usr/bin/env bash
# Fuzz check for zverbs. Idempotent.
#
# 1. Runs every fuzz target over its committed seeds (fuzz/seeds/<target>/) as a plain
#    `cargo test` of the fuzz crate: no cargo-fuzz, no nightly.
# 2. If cargo-fuzz is installed or installable and builds the targets here, runs each target
#    under libFuzzer for FUZZ_SECONDS (default 20) seconds, starting from the seeds; the
#    growing corpus stays in fuzz/corpus/<target>/ (git-ignored), crashes land in
#    fuzz/artifacts/<target>/. Otherwise says why it skipped this leg.
#
# cargo-fuzz passes -Z flags (sanitizer, coverage instrumentation) to rustc; on the stable
# toolchain they are unlocked with RUSTC_BOOTSTRAP=1, which this script sets for that leg.
#
# A target with a dictionary (fuzz/dicts/<target>.dict) is run with it.
#
# Environment: FUZZ_SECONDS (per target), FUZZ_TARGETS (space-separated, default all),
# FUZZ_SANITIZER (address | none; default: address, falling back to none).
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
read -r -a TARGETS <<<"${FUZZ_TARGETS:-endpoint_decode sim_ops exchange_frame network_config rpc_header}"
MANIFEST=fuzz/Cargo.toml

step() { printf '\n== %s ==\n' "$*"; }

step "fuzz targets over their seeds (plain cargo test)"
cargo test --manifest-path "$MANIFEST" --release

step "libFuzzer (cargo-fuzz), ${FUZZ_SECONDS}s per target"
skip() {
  echo "skipped the libFuzzer leg: $*"
  echo "fuzz check done (seed tests only)"
  exit 0
}
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz is not installed: cargo install cargo-fuzz --locked"
  cargo install cargo-fuzz --locked || skip "cargo-fuzz could not be installed"
fi
cargo fuzz --version

export RUSTC_BOOTSTRAP=1
sanitizers=("${FUZZ_SANITIZER:-address}")
[ -z "${FUZZ_SANITIZER:-}" ] && sanitizers+=(none)
# -a: debug assertions and overflow checks in the fuzzed code too.
san=""
for s in "${sanitizers[@]}"; do
  if cargo fuzz build --fuzz-dir fuzz -a --sanitizer "$s"; then
    san="$s"
    break
  fi
  echo "cargo fuzz build with sanitizer '$s' failed"
done
[ -n "$san" ] || skip "cargo fuzz build failed with every sanitizer tried (${sanitizers[*]})"

summary=()
for t in "${TARGETS[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  log="fuzz/artifacts/$t/last-run.log"
  echo "-- $t (sanitizer: $san)"
  extra=()
  [ -f "fuzz/dicts/$t.dict" ] && extra+=("-dict=fuzz/dicts/$t.dict")
  # New inputs go to the first directory only; the seeds are read, never written.
  if ! cargo fuzz run --fuzz-dir fuzz -a --sanitizer "$san" "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
      -max_total_time="$FUZZ_SECONDS" -timeout=10 -max_len=4096 -print_final_stats=1 \
      ${extra[@]+"${extra[@]}"} >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "FAIL: $t crashed or hung; reproducer in fuzz/artifacts/$t/ (full log: $log)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
  corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
  summary+=("$t: ${runs:-?} runs in ${FUZZ_SECONDS}s (${rate:-?}/s), ${cov:-cov: ?}, corpus ${corpus} files")
done

step "summary"
printf '%s\n' "${summary[@]}"
echo "fuzz check done"
