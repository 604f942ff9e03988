#!/usr/bin/env bash
# User-space instructions per post + poll on the verbs path, in the rxe guest under
# callgrind: zverbs (a Channel's unpolled post and try_complete) against raw verbs
# (ibv_post_send / ibv_poll_cq through the provider's op table, as verbs.h does), raw
# verbs through the provider's ibv_wr_* builders (`raw_wr`: the floor of the path zverbs'
# RC sends and sideway take), the `ibverbs` crate 0.9.2 and `sideway` 0.4.3. Same operation for all: one signaled 64-byte
# SEND between two RC queue pairs on rxe0, and one poll that takes its completion; then a
# doorbell batch of 32 RDMA WRITEs, the last signaled (not `ibverbs`, which has no WRITE),
# for zverbs also as a `Batch` built once and executed by `Channel::execute_batch`
# (`prepared`, as raw verbs' chain is built once), and zverbs' SEND through a `Channel`
# scope and as the blocking `Channel::send` (`blocking`)
# (benches/verbs_peers/src/main.rs says how the loop and the counting work).
#
#   scripts/verbs-instructions.sh [LIB...]     default: zverbs raw raw_wr ibverbs sideway
#
# Environment: N1, N2 (loop lengths whose difference is measured, default 100 and 600), K
# (empty polls measured, default 500), CG_DIR (keep each run's callgrind output there, for
# callgrind_annotate), CG_ARGS (more callgrind options, e.g. --dump-instr=yes). The guest runs the host's callgrind (copied in
# with the loader's debug symbols, which valgrind needs; the guest's libc is the same
# Debian build). Needs what scripts/rxe-test.sh needs, and valgrind and libc6-dbg here.
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$ROOT"
LIBS=${*:-zverbs raw raw_wr ibverbs sideway}
N1=${N1:-100} N2=${N2:-600} K=${K:-500} CG_DIR=${CG_DIR:-} CG_ARGS=${CG_ARGS:-}
for t in valgrind readelf; do command -v $t >/dev/null || { echo "$t not found" >&2; exit 1; }; done

cargo build --release --manifest-path benches/verbs_peers/Cargo.toml
carry=$(mktemp -d)
trap 'rm -rf "$carry"' EXIT
cp benches/verbs_peers/target/release/verbs_peers "$carry/verbs_loop"
mkdir -p "$carry/vg/libexec"
# Debian's /usr/bin/valgrind is a shell wrapper around valgrind.bin, the launcher.
cp /usr/bin/valgrind.bin "$carry/vg/valgrind"
cp /usr/libexec/valgrind/{callgrind-amd64-linux,vgpreload_core-amd64-linux.so,default.supp} "$carry/vg/libexec/"
ldso=$(readlink -f /lib64/ld-linux-x86-64.so.2)
id=$(readelf -n "$ldso" | sed -n 's/.*Build ID: //p')
dbg=/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug
[ -f "$dbg" ] || { echo "no debug symbols for $ldso ($dbg): apt-get install libc6-dbg" >&2; exit 1; }
mkdir -p "$carry/vg/debug/${id:0:2}"
cp "$dbg" "$carry/vg/debug/${id:0:2}/"

cat > "$carry/driver.sh" <<EOF
#!/bin/sh
set -e
cd /mnt/host
mkdir -p /usr/libexec/valgrind /usr/lib/debug/.build-id
cp vg/libexec/* /usr/libexec/valgrind/
cp -r vg/debug/* /usr/lib/debug/.build-id/
for lib in $LIBS; do
  runs="send:$N1 send:$N2 empty:$K"
  [ \$lib = ibverbs ] || runs="\$runs batch:$N1 batch:$N2"
  [ \$lib = zverbs ] && runs="\$runs scope:$N1 scope:$N2 prepared:$N1 prepared:$N2 blocking:$N1 blocking:$N2"
  for run in \$runs; do
    run=\$(echo \$run | tr : ' ')
    set -- \$run
    out=/tmp/cg.\$lib.\$1.\$2
    if ! ./vg/valgrind --tool=callgrind --callgrind-out-file=\$out --toggle-collect='*measured_*' $CG_ARGS \\
        ./verbs_loop \$lib \$1 \$2 >/tmp/res 2>/tmp/err; then
      tail -n 20 /tmp/err; exit 1
    fi
    echo "RESULT \$lib \$1 \$2 \$(sed -n 's/^summary: //p' \$out) \$(cat /tmp/res)"
    if [ -n "$CG_DIR" ]; then echo "BEGIN \$(basename \$out)"; cat \$out; echo "END"; fi
  done
done
EOF
chmod +x "$carry/driver.sh" "$carry/verbs_loop" "$carry/vg/valgrind"
out=$(RXE_CARRY="$carry" scripts/rxe-test.sh --run "$carry/driver.sh" | tee /dev/stderr)

if [ -n "$CG_DIR" ]; then
  mkdir -p "$CG_DIR"
  awk -v dir="$CG_DIR" '/^BEGIN cg\./ { f = dir "/" $2; next } /^END$/ { f = ""; next } f { print > f }' <<<"$out"
fi

# Per library and mode: ((Ir₂ − Ir₁) − (E₂ − E₁) · Ir_empty / K) / (N₂ − N₁); a batch's
# figure also per WR.
grep '^RESULT ' <<<"$out" | awk -v n1="$N1" -v n2="$N2" -v k="$K" '
  { split($7, e, "="); lib = $2; m = $3; key = lib " " m
    if (m == "empty") { empty[lib] = $5 / k; next }
    if ($4 == n1) { ir1[key] = $5; e1[key] = e[2] } else { ir2[key] = $5; e2[key] = e[2] }
    if (!(key in seen)) { seen[key]; order[++n] = key } }
  END {
    printf "%-8s %-8s %12s %10s %12s %20s\n", "library", "mode", "Ir per op", "per WR", "empty poll", "empty polls (runs)"
    for (i = 1; i <= n; i++) {
      split(order[i], km, " "); l = km[1]; m = km[2]; key = order[i]
      per = ((ir2[key] - ir1[key]) - (e2[key] - e1[key]) * empty[l]) / (n2 - n1)
      wr = (m == "batch" || m == "prepared") ? sprintf("%.1f", per / 32) : "-"
      printf "%-8s %-8s %12.1f %10s %12.1f %20s\n", l, m, per, wr, empty[l], e1[key] "/" e2[key]
      val[key] = per
    }
    for (i = 1; i <= n; i++) {
      split(order[i], km, " "); l = km[1]; m = km[2]
      base = (m == "scope" || m == "blocking") ? "raw send" : (m == "prepared") ? "raw batch" : "raw " m
      if (l != "raw" && l != "raw_wr" && (base in val))
        printf "%-8s %-8s %+.1f over raw verbs (%s)\n", l, m, val[order[i]] - val[base], base
      sub(/^raw /, "raw_wr ", base)
      if ((l == "zverbs" || l == "sideway") && (base in val))
        printf "%-8s %-8s %+.1f over raw builders (%s)\n", l, m, val[order[i]] - val[base], base
    }
  }'
