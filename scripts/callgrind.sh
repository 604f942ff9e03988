#!/usr/bin/env bash
# Instructions per post+poll under callgrind: the library path (`Channel`) against raw
# provider calls (`Provider::post_send` + `Provider::poll_cq`), and their difference (the
# library's overhead). Instruction counts do not depend on the machine's load, unlike
# timings, so this is the figure behind the "≤ 50 instructions" target in BENCHMARKS.md.
#
#   scripts/callgrind.sh            # send and write, both paths
#   OPS=send scripts/callgrind.sh   # one operation
#   N1=2560 N2=25600 scripts/callgrind.sh
#   BATCHES="8 32" scripts/callgrind.sh   # doorbell batches of writes (default: 32)
#   ASYNC=0 scripts/callgrind.sh    # without the async comparison (a second build)
#
# Also printed: the channel on a shared completion queue (the dispatcher's cost per
# operation, `shared+`) and, from a build with tokio, an awaited `AsyncChannel` operation
# against the blocking one (`async+`).
#
# Each (path, op) runs `examples/post_poll_loop.rs` twice, with N1 and N2 iterations; setup
# and teardown are the same in both runs, so (Ir(N2) - Ir(N1)) / (N2 - N1) is the cost of
# one iteration exactly. A third run collects only inside the loop function and is kept,
# annotated, under $OUT for profiling (`callgrind_annotate --inclusive=yes`).
set -euo pipefail
cd "$(dirname "$0")/.."

# valgrind, installed once (idempotent).
if ! command -v valgrind >/dev/null 2>&1; then
    echo "installing valgrind..." >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq valgrind >/dev/null
fi

N1=${N1:-2560}
N2=${N2:-25600}
OPS=${OPS:-"send write"}
BATCHES=${BATCHES:-32}
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET/callgrind}
mkdir -p "$OUT"

cargo build --quiet --release --features sim --example post_poll_loop
BIN=$TARGET/release/examples/post_poll_loop

# Total instructions of one run (the `summary:` line callgrind writes).
instructions() { # path op iters [batch | tokio]
    local f="$OUT/$1-$2-$3-${4:-1}.out" batch=${4:-1}
    [ "$batch" = tokio ] && batch=1
    valgrind --tool=callgrind --callgrind-out-file="$f" "$BIN" "$1" "$2" "$3" "$batch" 2>/dev/null
    awk '/^summary:/ { print $2 }' "$f"
}

# A profile of the loop alone, annotated with inclusive costs.
profile() { # path op loop-function
    local f="$OUT/$1-$2-loop.out"
    valgrind --tool=callgrind --callgrind-out-file="$f" \
        --toggle-collect="*post_poll_loop::$3*" "$BIN" "$1" "$2" "$N2" 2>/dev/null
    callgrind_annotate --inclusive=yes "$f" >"$OUT/$1-$2.annotate.txt" 2>/dev/null || true
}

printf '%-6s %-8s %16s\n' op path "Ir/op"
declare -A per
for op in $OPS; do
    for path in channel raw; do
        a=$(instructions "$path" "$op" "$N1")
        b=$(instructions "$path" "$op" "$N2")
        per[$path]=$(awk -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" \
            'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }')
        printf '%-6s %-8s %16s\n' "$op" "$path" "${per[$path]}"
    done
    overhead=$(awk -v c="${per[channel]}" -v r="${per[raw]}" 'BEGIN { printf "%.1f", c - r }')
    printf '%-6s %-8s %16s   (target <= 50)\n' "$op" overhead "$overhead"
    echo "instructions_per_op op=$op channel=${per[channel]} raw=${per[raw]} overhead=$overhead"
    if [ "$op" = send ]; then
        profile channel send channel_send_loop
        profile raw send raw_loop
    else
        profile channel write channel_write_loop
        profile raw write raw_loop
    fi
done
# The dispatcher: the same blocking operations on a shared completion queue.
for op in $OPS; do
    a=$(instructions shared "$op" "$N1")
    b=$(instructions shared "$op" "$N2")
    shared=$(awk -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" \
        'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }')
    c=$(awk -v a="$(awk '/^summary:/ { print $2 }' "$OUT/channel-$op-$N1-1.out")" \
        -v b="$(awk '/^summary:/ { print $2 }' "$OUT/channel-$op-$N2-1.out")" \
        -v n1="$N1" -v n2="$N2" 'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }')
    over=$(awk -v s="$shared" -v c="$c" 'BEGIN { printf "%.1f", s - c }')
    printf '%-6s %-8s %16s\n' "$op" shared "$shared"
    printf '%-6s %-8s %16s   (dispatcher over own queues)\n' "$op" shared+ "$over"
    echo "shared_instructions_per_op op=$op shared=$shared own=$c overhead=$over"
done
# Doorbell batches: BATCH writes per doorbell, one completion; instructions per WR.
for batch in $BATCHES; do
    m1=$((N1 / batch > 0 ? N1 / batch : 1))
    m2=$((N2 / batch > m1 ? N2 / batch : m1 + 1))
    for path in channel raw; do
        a=$(instructions "$path" write "$m1" "$batch")
        b=$(instructions "$path" write "$m2" "$batch")
        per[$path]=$(awk -v a="$a" -v b="$b" -v n1="$m1" -v n2="$m2" -v k="$batch" \
            'BEGIN { printf "%.1f", (b - a) / ((n2 - n1) * k) }')
        printf '%-6s %-8s %16s   (per WR)\n' "w*$batch" "$path" "${per[$path]}"
    done
    overhead=$(awk -v c="${per[channel]}" -v r="${per[raw]}" 'BEGIN { printf "%.1f", c - r }')
    printf '%-6s %-8s %16s   (per WR)\n' "w*$batch" overhead "$overhead"
    echo "instructions_per_wr batch=$batch channel=${per[channel]} raw=${per[raw]} overhead=$overhead"
done
# The async layer (feature tokio): an awaited operation against the blocking one, both
# from one build with tokio (the feature alone moves the blocking figures by a few tens
# of instructions, so the two are compared within that build). ASYNC=0 skips it.
if [ "${ASYNC:-1}" != 0 ]; then
    cargo build --quiet --release --features sim,tokio --example post_poll_loop
    cp "$TARGET/release/examples/post_poll_loop" "$OUT/post_poll_loop-tokio"
    BIN=$OUT/post_poll_loop-tokio
    for op in $OPS; do
        for path in channel async; do
            a=$(instructions "$path" "$op" "$N1" tokio)
            b=$(instructions "$path" "$op" "$N2" tokio)
            per[$path]=$(awk -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" \
                'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }')
            printf '%-6s %-8s %16s   (tokio build)\n' "$op" "$path" "${per[$path]}"
        done
        overhead=$(awk -v c="${per[async]}" -v r="${per[channel]}" 'BEGIN { printf "%.1f", c - r }')
        printf '%-6s %-8s %16s   (async over blocking)\n' "$op" async+ "$overhead"
        echo "async_instructions_per_op op=$op async=${per[async]} blocking=${per[channel]} overhead=$overhead"
    done
fi
echo "profiles: $OUT/*.annotate.txt" >&2
