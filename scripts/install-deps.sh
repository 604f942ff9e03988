#!/usr/bin/env bash
# Installs the system packages zverbs needs on Debian. Idempotent.
# The simulator backend (feature `sim`) needs only a Rust toolchain and a C linker; the
# fuzz crate also a C++ compiler.
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
# The fuzz crate (fuzz/, run by .ci/run as plain tests) builds libFuzzer, which is C++.
command -v c++ >/dev/null 2>&1 || need+=(g++)
# The instruction benches (benches/instructions.rs) count under callgrind.
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}"
fi
echo "dependencies present"
