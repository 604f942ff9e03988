#!/usr/bin/env bash
# Installs what the `verbs` feature and the soft-RoCE guest harness need on Debian 12.
# Idempotent: installs only missing packages, and runs `apt-get update` only when needed.
#
#   scripts/install-verbs-deps.sh            build deps + guest-harness deps
#   scripts/install-verbs-deps.sh --build    only what `cargo build --features verbs` needs
#   scripts/install-verbs-deps.sh --check    report what is missing, install nothing (exit 1 if any)
#
# Build: the verbs backend links librdmacm (librdmacm-dev: the connection manager).
# ibverbs-sys 0.3 runs bindgen (libclang) over the rdma-core headers and links
# libibverbs. With RDMA_CORE_INCLUDE_DIR / RDMA_CORE_LIB_DIR set (the repository's
# .cargo/config.toml does, pointing at the Debian paths) its build script skips the
# vendored rdma-core cmake build and uses libibverbs-dev from here; cmake is installed
# anyway so that a build without those variables works too.
#
# Guest harness (scripts/rxe-test.sh): qemu (software emulation), its qboot BIOS (in
# qemu-system-data), cpio/binutils/python3 to build the initramfs. The guest's own packages
# (Debian kernel, rdma-core, perftest, busybox, ...) are not installed on the host: the
# harness fetches them with `apt-get download` and unpacks them into its image, which needs
# only the apt lists that this script refreshes.
set -euo pipefail

mode=all
case "${1:-}" in
  "") ;;
  --build) mode=build ;;
  --check) mode=check ;;
  -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--build|--check]" >&2; exit 2 ;;
esac

build_pkgs=(gcc pkg-config cmake libibverbs-dev librdmacm-dev libclang1-14 libclang-common-14-dev)
guest_pkgs=(qemu-system-x86 qemu-system-data cpio binutils python3 ibverbs-utils)

want=("${build_pkgs[@]}")
[ "$mode" = build ] || want+=("${guest_pkgs[@]}")

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

command -v cargo >/dev/null 2>&1 || echo "note: cargo not found: install Rust with rustup (https://rustup.rs)" >&2

if [ ${#missing[@]} -eq 0 ]; then
  echo "verbs dependencies present"
  exit 0
fi
if [ "$mode" = check ]; then
  echo "missing: ${missing[*]}"
  exit 1
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
# Refresh the lists when they are absent or older than a day (also needed by the harness's
# `apt-get download` of the guest packages).
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
  $SUDO apt-get update -qq
fi
echo "installing: ${missing[*]}"
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "verbs dependencies installed"
