#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and its driver (no CUDA toolkit needed:
# cudarc loads libcuda.so at run time): the simulator's device memory on the GPU, 1 GiB of
# RDMA writes from a peer, every byte read back on the GPU's side, the rate; and the dmabuf
# export of a CUDA allocation. With a NIC that imports dmabufs (ZVERBS_DEVICE=mlx5_0) and
# FEATURES=cuda,sim,verbs, the verbs path too. Prints SKIPPED for what cannot run there.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
cargo build --release --features "${FEATURES:-cuda,sim}" --example gpu_write
target/release/examples/gpu_write --mib "${MIB:-1024}"
