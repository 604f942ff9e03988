#!/usr/bin/env bash
# zverbs against perftest on soft-RoCE (rxe0), in one qemu guest boot.
#
# Builds `examples/zverbs_perf` (release, feature `verbs`) on the host and runs it in the
# guest of scripts/rxe-test.sh with `--backend verbs --vs-perftest`: perftest's
# ib_send_lat, ib_write_lat and ib_write_bw (server and client on 127.0.0.1, on rxe0) and
# zverbs-perf's equivalents (both ends on rxe0, loopback), interleaved round by round, then
# the ratio table zverbs/perftest. Waits while another qemu guest runs (one at a time).
#
#   scripts/rxe-perf.sh                          # defaults: 2 rounds, lat sizes 2,64,4096
#                                                # (1000 iterations), bw 4096,65536 (2000)
#   scripts/rxe-perf.sh --rounds 3 --iters 500   # any zverbs_perf options
#   scripts/rxe-perf.sh --sizes 64               # one size for every test
#
# The guest is software-emulated (TCG): absolute figures are far from any hardware (tens of
# microseconds per round trip); the ratios compare two programs on the same emulated
# device in the same boot. Environment: as scripts/rxe-test.sh (RXE_TIMEOUT, RXE_SMP, ...);
# RXE_PERF_WAIT (seconds to wait for another guest to finish, default 1800).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

log() { printf 'rxe-perf: %s\n' "$*" >&2; }

# The verbs build and the guest harness need host packages (idempotent, quick when present).
scripts/install-verbs-deps.sh >&2

json=$(cargo build --release --features verbs --example zverbs_perf --message-format=json 2>/dev/null) || {
    cargo build --release --features verbs --example zverbs_perf
    exit 1
}
exe=$(grep -o '"executable":"[^"]*/examples/zverbs_perf"' <<<"$json" | tail -1 | cut -d'"' -f4)
[ -n "$exe" ] || { log "cannot find the zverbs_perf executable"; exit 1; }

# One qemu guest at a time on these machines.
waited=0
while pgrep -f qemu-system >/dev/null; do
    [ "$waited" -ge "${RXE_PERF_WAIT:-1800}" ] && { log "another qemu guest is still running; giving up"; exit 1; }
    [ "$waited" = 0 ] && log "another qemu guest is running; waiting for it to finish"
    sleep 10
    waited=$((waited + 10))
done

log "running zverbs_perf --vs-perftest in the guest (rxe0)"
exec scripts/rxe-test.sh --run "$exe" --backend verbs --device rxe0 --vs-perftest "$@"
