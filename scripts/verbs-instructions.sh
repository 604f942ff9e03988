#!/usr/bin/env bash
# User-space instructions per post + poll on the verbs path, in the rxe guest under
# callgrind: zverbs (a Channel's unpolled post and try_complete) against raw verbs
# (ibv_post_send / ibv_poll_cq through the provider's op table, as verbs.h does), the
# `ibverbs` crate 0.9.2 and `sideway` 0.4.3. Same operation for all: one signaled 64-byte
# SEND between two RC queue pairs on rxe0, and one poll that takes its completion
# (benches/verbs_peers/src/main.rs says how the loop and the counting work).
#
#   scripts/verbs-instructions.sh [LIB...]     default: zverbs raw ibverbs sideway
#
# Environment: N1, N2 (loop lengths whose difference is measured, default 100 and 600), K
# (empty polls measured, default 500), CG_DIR (keep each run's callgrind output there, for
# callgrind_annotate). The guest runs the host's callgrind (copied in
# with the loader's debug symbols, which valgrind needs; the guest's libc is the same
# Debian build). Needs what scripts/rxe-test.sh needs, and valgrind and libc6-dbg here.
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$ROOT"
LIBS=${*:-zverbs raw ibverbs sideway}
N1=${N1:-100} N2=${N2:-600} K=${K:-500} CG_DIR=${CG_DIR:-}
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
  for run in "send $N1" "send $N2" "empty $K"; do
    set -- \$run
    out=/tmp/cg.\$lib.\$1.\$2
    if ! ./vg/valgrind --tool=callgrind --callgrind-out-file=\$out --toggle-collect='*measured_*' \\
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

# Per library: ((Ir₂ − Ir₁) − (E₂ − E₁) · Ir_empty / K) / (N₂ − N₁).
grep '^RESULT ' <<<"$out" | awk -v n1="$N1" -v n2="$N2" -v k="$K" '
  { split($7, e, "="); lib = $2
    if ($3 == "send" && $4 == n1) { ir1[lib] = $5; e1[lib] = e[2] }
    else if ($3 == "send") { ir2[lib] = $5; e2[lib] = e[2] }
    else { empty[lib] = $5 / k }
    if (!(lib in seen)) { seen[lib]; order[++n] = lib } }
  END {
    printf "%-8s %14s %12s %20s\n", "library", "Ir per op", "empty poll", "empty polls (runs)"
    for (i = 1; i <= n; i++) {
      l = order[i]
      per = ((ir2[l] - ir1[l]) - (e2[l] - e1[l]) * empty[l]) / (n2 - n1)
      printf "%-8s %14.1f %12.1f %20s\n", l, per, empty[l], e1[l] "/" e2[l]
      if (l == "raw") raw = per
      val[l] = per
    }
    if (raw != "") for (i = 1; i <= n; i++) if (order[i] != "raw")
      printf "%-8s %+.1f over raw verbs\n", order[i], val[order[i]] - raw
  }'
