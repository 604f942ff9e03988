#!/usr/bin/env bash
# Runs zverbs' verbs backend on soft-RoCE (rxe) inside a small qemu guest.
#
# The host kernel needs no RDMA support: the guest boots Debian's own kernel under qemu's
# software emulation (TCG), loads rdma_rxe, creates rxe0 on a dummy netdev and runs
# host-built binaries from a 9p share. The guest image (kernel + initramfs, from Debian
# packages) is built once and cached under target/rxe/.
#
#   scripts/rxe-test.sh              conformance suite on rxe0 + on the simulator, and the
#                                    differential table; then, in the same guest, the
#                                    examples pingpong, network (ranks as threads, and as
#                                    processes under mpirun -n 4 --bootstrap env),
#                                    rping against rdma-core's rping in both roles,
#                                    udaddy against rdma-core's udaddy in both roles,
#                                    srq_pingpong against rdma-core's ibv_srq_pingpong in both
#                                    roles, async_remote_write and rpc_echo on rxe0 (--backend verbs);
#                                    exits non-zero if any of it fails
#   scripts/rxe-test.sh --run PROG [ARGS...]
#                                    run one host-built program in a fresh guest, exit with its
#                                    status (usable as a cargo runner, see README)
#   scripts/rxe-test.sh --mpi N PROG [ARGS...]
#                                    the same with PROG started as N ranks by Open MPI's mpirun
#                                    (one node, oversubscribed, ZVERBS_* and RUST_* forwarded);
#                                    exit with mpirun's status
#   scripts/rxe-test.sh --image      only build (or check) the cached guest image
#   scripts/rxe-test.sh --can-run    exit 0 if this machine can run the guest (for CI)
#   scripts/rxe-test.sh --shell      interactive guest shell (Ctrl-a x quits qemu)
#
# Environment: RXE_CARRY (with --run: a directory whose files the guest finds beside the
# program, in /mnt/host), RXE_DIR (cache, default <repo>/target/rxe), RXE_TIMEOUT (seconds per boot,
# default 900), RXE_REBUILD=1 (rebuild the image), RXE_ACCEL (default tcg: the /dev/kvm of
# these machines cannot boot a stock kernel), RXE_MEM, RXE_SMP; for the examples in the
# default mode RXE_PINGPONG_ROUNDS (default 1000), RXE_NETWORK_NODES (default 4) and
# RXE_NETWORK_BARRIERS (default 200). ZVERBS_* and RUST_* variables are passed to the
# programs in the guest, which also see ZVERBS_DEVICE=rxe0. Binaries are built with the
# caller's cargo settings (CARGO_TARGET_DIR too).
# Host needs: scripts/install-verbs-deps.sh (qemu, cpio, binutils, python3, apt lists).
set -euo pipefail

ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
W=${RXE_DIR:-$ROOT/target/rxe}
TIMEOUT=${RXE_TIMEOUT:-900}
RECIPE_VERSION=2

log() { printf 'rxe-test: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# Debian packages unpacked into the guest (no maintainer scripts run).
GUEST_PKGS="busybox-static kmod iproute2 rdma-core ibverbs-providers ibverbs-utils perftest
libibverbs1 librdmacm1 libibumad3 libnl-3-200 libnl-route-3-200 libc6 libgcc-s1 libmnl0
libelf1 libbpf1 libcap2 libdb5.3 libselinux1 libpcre2-8-0 libtirpc3 libtirpc-common
libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1 libssl3
libxtables12 zlib1g libzstd1 liblzma5 libkmod2 libpci3 libudev1 libbsd0 libmd0 rdmacm-utils"
# Open MPI's launcher, for mpirun in the guest (--mpi): orterun/orted, the ORTE/OPAL plugins it
# loads (in libopenmpi3) and the libraries they link against (ldd), nothing else: the ranks are
# zverbs programs that take rank and size from the launcher's environment, not libmpi users, so
# the plugins for MPI proper (ucx, ofi, psm, numa...) may lack their libraries.
GUEST_MPI_PKGS="openmpi-bin openmpi-common libopenmpi3 libpmix2 libmunge2 libevent-core-2.1-7
libevent-pthreads-2.1-7 libhwloc15"
# Kernel modules (with their dependency closure). crc32_generic: rdma_rxe needs the "crc32"
# shash but does not declare it.
GUEST_MODS="rdma_rxe crc32_generic ib_uverbs ib_umad rdma_ucm rdma_cm virtio_pci 9p
9pnet_virtio dummy"

# PID 1 of the guest.
guest_init() {
  cat <<'EOF'
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox --install -s 2>/dev/null
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t tmpfs tmpfs /tmp
# For mpirun: shared memory and a host name (the image's /etc/hosts knows it).
mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm
hostname rxe
ip link set lo up
# No udev: load virtio and 9p ourselves.
modprobe -a virtio_pci 9pnet_virtio 9p
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host0 /mnt/host || echo "init: no 9p share"
# Soft-RoCE: crc32_generic first; rxe0 on a dummy netdev with a link-local IPv4 address, so
# that GID index 1 is the RoCE v2 ::ffff:169.254.77.1 entry (rdma_cm works on it too).
modprobe -a crc32_generic rdma_rxe ib_uverbs rdma_ucm ib_umad
modprobe dummy numdummies=0
ip link add dummy0 type dummy
ip addr add 169.254.77.1/16 dev dummy0
ip link set dummy0 up
rdma link add rxe0 type rxe netdev dummy0 || echo "init: rdma link add failed"
echo "init: rxe0 up at $(cut -d' ' -f1 /proc/uptime)s"
case "$(sed -n 's/.*rxemode=\([a-z]*\).*/\1/p' /proc/cmdline)" in
  shell) setsid cttyhack sh ;;
  *) sh /mnt/host/test.sh 2>&1 ;;
esac
echo "init: done at $(cut -d' ' -f1 /proc/uptime)s"
sync
poweroff -f
EOF
}

recipe_hash() {
  { echo "$RECIPE_VERSION"; echo "$GUEST_PKGS $GUEST_MPI_PKGS"; echo "$GUEST_MODS"; guest_init; } | sha256sum | cut -c1-16
}

# Prints the relative paths of modules $2.. and their dependencies under module dir $1.
mod_closure() {
  local dir=$1; shift
  local all; all=$(find "$dir/kernel" -name '*.ko*')
  local -A seen=()
  local queue=("$@") m f deps
  while [ ${#queue[@]} -gt 0 ]; do
    m=${queue[0]//-/_}; queue=("${queue[@]:1}")
    [ -n "${seen[$m]:-}" ] && continue
    seen[$m]=1
    f=$(grep -E "/(${m}|${m//_/-})\.ko(\.xz|\.zst)?$" <<<"$all" | head -1 || true)
    [ -n "$f" ] || continue # built into the kernel
    echo "${f#"$dir"/}"
    deps=$(objcopy -O binary --only-section=.modinfo "$f" /dev/stdout 2>/dev/null |
      tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' ')
    for d in $deps; do queue+=("$d"); done
  done
}

build_image() {
  local want; want=$(recipe_hash)
  if [ "${RXE_REBUILD:-0}" != 1 ] && [ -f "$W/out/vmlinux" ] && [ -f "$W/out/initrd.img" ] &&
    [ "$(cat "$W/out/stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  for t in apt-get apt-cache dpkg cpio objcopy python3 qemu-system-x86_64; do
    command -v "$t" >/dev/null || die "$t not found: run scripts/install-verbs-deps.sh"
  done
  local t0=$SECONDS
  log "building the guest image in $W (once)"
  mkdir -p "$W/debs" "$W/out"
  local kpkg
  kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/.*Depends: \(linux-image-[0-9].*\)/\1/p' | head -1)
  [ -n "$kpkg" ] || die "cannot resolve linux-image-amd64: run scripts/install-verbs-deps.sh (apt lists)"
  # shellcheck disable=SC2086
  (cd "$W/debs" && apt-get download -q $kpkg $GUEST_PKGS $GUEST_MPI_PKGS 2>&1 | grep -v -e unsandboxed -e '^Get:' >&2 || true)
  deb() { ls "$W"/debs/"$1"_*.deb 2>/dev/null | sort -V | tail -1; }
  [ -n "$(deb "$kpkg")" ] || die "download of $kpkg failed"

  rm -rf "$W/kernel" "$W/rootfs"
  mkdir -p "$W/kernel" "$W/rootfs"
  dpkg -x "$(deb "$kpkg")" "$W/kernel"
  local kv; kv=$(ls "$W/kernel/lib/modules")
  # The uncompressed kernel (an ELF with a PVH entry) boots much faster under TCG than the
  # bzImage: no real-mode setup, no decompression.
  python3 - "$W/kernel/boot/vmlinuz-$kv" "$W/out/vmlinux" <<'EOF'
import lzma, sys
d = open(sys.argv[1], 'rb').read()
off = d.find(b'\xfd7zXZ\x00')  # Debian 12 kernels are xz-compressed
out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d[off:])
assert out[:4] == b'\x7fELF', "no ELF kernel inside the bzImage"
open(sys.argv[2], 'wb').write(out)
EOF

  local r=$W/rootfs p f
  for p in $GUEST_PKGS $GUEST_MPI_PKGS; do
    f=$(deb "$p"); [ -n "$f" ] || die "download of $p failed"
    dpkg -x "$f" "$r"
  done
  # What maintainer scripts and base-files would provide: the alternatives' mpirun, and for
  # Open MPI a user name for uid 0 (getpwuid) and a resolvable host name.
  ln -sf mpirun.openmpi "$r/usr/bin/mpirun"
  mkdir -p "$r/etc"
  echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"
  echo 'root:x:0:' > "$r/etc/group"
  printf '127.0.0.1 localhost\n127.0.1.1 rxe\n' > "$r/etc/hosts"
  printf 'passwd: files\ngroup: files\nhosts: files\n' > "$r/etc/nsswitch.conf"
  # Single node and no ssh: the isolated launcher (mpirun's default, rsh, fails without an agent).
  printf '\nplm = isolated\n' >> "$r/etc/openmpi/openmpi-mca-params.conf"
  echo rxe > "$r/etc/hostname"
  rm -rf "$r"/usr/share/{doc,man,info,locale,bash-completion,lintian} "$r"/usr/lib/x86_64-linux-gnu/gconv
  mkdir -p "$r"/{proc,sys,dev,tmp,run,mnt/host,root}
  local m
  # shellcheck disable=SC2086
  for m in $(mod_closure "$W/kernel/lib/modules/$kv" $GUEST_MODS); do
    mkdir -p "$r/lib/modules/$kv/$(dirname "$m")"
    cp "$W/kernel/lib/modules/$kv/$m" "$r/lib/modules/$kv/$m"
  done
  cp "$W/kernel/lib/modules/$kv"/modules.{order,builtin,builtin.modinfo} "$r/lib/modules/$kv/" 2>/dev/null || true
  # depmod from the guest's kmod (kmod dispatches on argv[0]).
  ln -sf "$r/bin/kmod" "$W/depmod"
  LD_LIBRARY_PATH="$r/lib/x86_64-linux-gnu:$r/usr/lib/x86_64-linux-gnu" "$W/depmod" -b "$r" "$kv"
  ldconfig -r "$r"
  guest_init > "$r/init"
  chmod 0755 "$r/init"
  # Uncompressed cpio: unpacks faster than gzip under TCG.
  (cd "$r" && find . -print0 | cpio --null -o -H newc --quiet) > "$W/out/initrd.img"
  echo "$want" > "$W/out/stamp"
  log "guest image ready ($kpkg, $((SECONDS - t0)) s)"
}

# boot SHARE_DIR MODE: boots the guest with SHARE_DIR as /mnt/host.
boot() {
  local share=$1 mode=$2 bios=/usr/share/qemu/qboot.rom accel=${RXE_ACCEL:-tcg} a
  [ -f "$bios" ] || bios=
  if [ "$accel" = kvm ]; then a=(-accel kvm -cpu host); else a=(-accel tcg -cpu max); fi
  local tty=() input=/dev/null
  [ "$mode" = shell ] && { tty=(--foreground); input=/dev/stdin; }
  timeout "${tty[@]}" -k 5 "$TIMEOUT" qemu-system-x86_64 "${a[@]}" -m "${RXE_MEM:-1G}" \
    -smp "${RXE_SMP:-2}" -nographic -no-reboot -nic none ${bios:+-bios "$bios"} \
    -kernel "$W/out/vmlinux" -initrd "$W/out/initrd.img" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 cryptomgr.notests mitigations=off tsc=reliable no_timer_check rxemode=$mode" \
    -fsdev local,id=fs0,path="$share",security_model=none \
    -device virtio-9p-pci,fsdev=fs0,mount_tag=host0 < "$input"
}

# Exit status 0 if this machine can run the guest leg; prints why not otherwise.
can_run() {
  local t
  for t in qemu-system-x86_64 cpio objcopy python3 dpkg apt-get; do
    command -v "$t" >/dev/null || { echo "cannot run the rxe leg: $t not found (scripts/install-verbs-deps.sh)"; return 1; }
  done
  qemu-system-x86_64 -accel help 2>/dev/null | grep -qx tcg ||
    { echo "cannot run the rxe leg: this qemu has no TCG"; return 1; }
  if [ ! -f "$W/out/stamp" ] && ! apt-cache depends linux-image-amd64 2>/dev/null | grep -q 'Depends: linux-image-[0-9]'; then
    echo "cannot run the rxe leg: no Debian kernel package in the apt lists"; return 1
  fi
  echo "the rxe leg can run here"
}

# guest_vars: the names of the variables guest_exports exports.
guest_vars() {
  echo ZVERBS_DEVICE
  compgen -e | grep -E '^(RUST_|ZVERBS_)' | grep -v '^ZVERBS_DEVICE$' || true
}

# guest_exports: the guest script's environment (ZVERBS_DEVICE, default rxe0, and the
# caller's ZVERBS_* and RUST_* variables).
guest_exports() {
  printf 'export ZVERBS_DEVICE=%q\n' "${ZVERBS_DEVICE:-rxe0}"
  local v
  for v in $(guest_vars | grep -v '^ZVERBS_DEVICE$'); do
    printf 'export %s=%q\n' "$v" "${!v}"
  done
  printf 'cd /mnt/host\n'
}

# guest_step NAME CMD [ARGS...]: a guest script line running CMD with ARGS (quoted), its
# output in NAME.out/NAME.err, its status in NAME.rc, and its guest start and end times
# (uptime) appended to times.
guest_step() {
  local name=$1; shift
  printf 't0=$(cut -d" " -f1 /proc/uptime)\n'
  printf '%q' "$1"; shift; printf ' %q' "$@"
  printf ' >/mnt/host/%s.out 2>/mnt/host/%s.err\n' "$name" "$name"
  printf 'echo $? >/mnt/host/%s.rc\n' "$name"
  printf 'echo "%s $t0 $(cut -d" " -f1 /proc/uptime)" >>/mnt/host/times\n' "$name"
}

# guest_mpi_step NAME N [VAR=VALUE...] CMD [ARGS...]: like guest_step, with CMD started as N
# ranks by Open MPI's mpirun (one node, more ranks than CPUs allowed), each rank seeing the
# variables of guest_exports and the VAR=VALUE given: -x names each one (Open MPI 4.1's -x
# takes no wildcards).
guest_mpi_step() {
  local name=$1 n=$2; shift 2
  local x=() v
  for v in $(guest_vars); do x+=(-x "$v"); done
  while [[ ${1:-} =~ ^[A-Z_][A-Z0-9_]*= ]]; do x+=(-x "$1"); shift; done
  guest_step "$name" mpirun --allow-run-as-root --oversubscribe -n "$n" "${x[@]}" "$@"
}

# boot_share DIR: boots a guest that runs DIR/test.sh; sets GUEST_SECONDS; shows the console
# if rxe did not come up.
boot_share() {
  local d=$1 t0=$SECONDS qrc=0
  boot "$d" host > "$d/console.log" 2>&1 || qrc=$?
  GUEST_SECONDS=$((SECONDS - t0))
  grep -q 'rxe0 up' "$d/console.log" || { log "rxe setup problem (qemu status $qrc); console:"; tail -n 40 "$d/console.log" >&2; }
  return 0
}

# step_status DIR NAME: prints NAME's output and returns its status (125 if it did not
# finish, with the console's tail).
step_status() {
  local d=$1 name=$2
  [ -f "$d/$name.out" ] && cat "$d/$name.out"
  [ -f "$d/$name.err" ] && cat "$d/$name.err" >&2
  if [ -f "$d/$name.rc" ]; then return "$(cat "$d/$name.rc")"; fi
  log "$name did not finish; console:"
  tail -n 40 "$d/console.log" >&2
  return 125
}

# run_in_guest N PROG [ARGS...]: runs PROG in a fresh guest, as N ranks under mpirun if N > 0;
# its stdout/stderr are printed; returns its exit status (mpirun's if N > 0; 125 if it did not
# finish).
run_in_guest() {
  local n=$1 prog; prog=$(readlink -f "$2"); shift 2
  [ -x "$prog" ] || die "not an executable: $prog"
  mkdir -p "$W/runs"
  local d; d=$(mktemp -d "$W/runs/run.XXXXXX")
  cp "$prog" "$d/prog"
  # Files the program needs beside it (its share is all the guest sees of the host).
  if [ -n "${RXE_CARRY:-}" ]; then cp -r "$RXE_CARRY"/. "$d/"; fi
  {
    guest_exports
    if [ "$n" -gt 0 ]; then guest_mpi_step prog "$n" ./prog "$@"; else guest_step prog ./prog "$@"; fi
  } > "$d/test.sh"
  boot_share "$d"
  LAST_RUN=$d
  local rc=0
  step_status "$d" prog || rc=$?
  return "$rc"
}

# The differential table from two outcome files
# (backend<TAB>scenario<TAB>verdict<TAB>outcome<TAB>note, one line per scenario).
table() {
  # $1: the simulator's outcomes (backends "sim": the HCA personality, and "sim-rxe": the
  # simulator imitating rxe), $2: rxe's. The verdict compares sim-rxe with rxe; the sim
  # column shows where rxe departs from the spec (documented in tests/conformance/rxe.rs).
  # Exits non-zero if a scenario differs between sim-rxe and rxe.
  awk -F'\t' '
    FNR == NR && $1 == "sim"     { hv[$2] = $3; ho[$2] = $4; if (!($2 in seen)) { seen[$2]; order[++n] = $2 }; next }
    FNR == NR && $1 == "sim-rxe" { sv[$2] = $3; so[$2] = $4; if (!($2 in seen)) { seen[$2]; order[++n] = $2 }; next }
    FNR == NR { next }
    { rv[$2] = $3; ro[$2] = $4; rn[$2] = $5; if (!($2 in seen)) { seen[$2]; order[++n] = $2 } }
    END {
      printf "%-32s | %-5s | %-7s | %-5s | %s\n", "scenario", "sim", "sim-rxe", "rxe", "sim-rxe vs rxe"
      printf "%s\n", "---------------------------------+-------+---------+-------+----------------"
      for (i = 1; i <= n; i++) {
        s = order[i]
        a = (s in so) ? so[s] : "(not run)"; b = (s in ro) ? ro[s] : "(not run)"
        h = (s in ho) ? ho[s] : "(not run)"
        if (a != b) { diff++; verdict = "DIFFERENT" }
        else if (h != b) { same++; dev++; verdict = "same (rxe deviates from the spec; sim-rxe imitates it)" }
        else { same++; verdict = "same" }
        printf "%-32s | %-5s | %-7s | %-5s | %s\n", s, (s in hv) ? hv[s] : "-", (s in sv) ? sv[s] : "-", (s in rv) ? rv[s] : "-", verdict
      }
      printf "\n%d scenarios: %d same on sim-rxe and rxe (%d of them where rxe deviates from the spec, which the simulator as an HCA follows), %d different\n", n, same, dev, diff
      for (i = 1; i <= n; i++) {
        s = order[i]
        a = (s in so) ? so[s] : "(not run)"; b = (s in ro) ? ro[s] : "(not run)"
        h = (s in ho) ? ho[s] : "(not run)"
        if (a == b && h == b) continue
        printf "\n%s\n  sim (HCA): %s\n  sim-rxe:   %s\n  rxe:       %s\n", s, h, a, b
        if (rn[s] != "") printf "  why: %s\n", rn[s]
      }
      exit diff > 0
    }
  ' <(sort -t$'\t' -k2,2 "$1") <(sort -t$'\t' -k2,2 "$2")
}

# The executable of example $1 from cargo's JSON messages on stdin.
example_exe() {
  grep -o '"executable":"[^"]*/examples/'"$1"'"' | tail -1 | cut -d'"' -f4
}

conformance() {
  cd "$ROOT"
  build_image
  local t0=$SECONDS exe json pingpong network async rpc srq
  log "building the verbs conformance tests and the examples pingpong, network, async_remote_write and rpc_echo"
  # With tokio: the async scenario joins the suite on both backends.
  exe=$(cargo test --features verbs,tokio --test conformance_verbs --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
  [ -n "$exe" ] || { cargo test --features verbs,tokio --test conformance_verbs --no-run; die "build failed"; }
  json=$(cargo build --features verbs --example pingpong --example network --example rpc_echo \
    --example rping --example udaddy --example srq_pingpong --message-format=json 2>/dev/null) || true
  pingpong=$(example_exe pingpong <<<"$json")
  network=$(example_exe network <<<"$json")
  rpc=$(example_exe rpc_echo <<<"$json")
  rping=$(example_exe rping <<<"$json")
  udaddy=$(example_exe udaddy <<<"$json")
  srq=$(example_exe srq_pingpong <<<"$json")
  json=$(cargo build --features verbs,tokio --example async_remote_write --message-format=json 2>/dev/null) || true
  async=$(example_exe async_remote_write <<<"$json")
  [ -n "$pingpong" ] && [ -n "$network" ] && [ -n "$async" ] && [ -n "$rpc" ] && [ -n "$rping" ] && [ -n "$udaddy" ] && [ -n "$srq" ] ||
    { cargo build --features verbs --example pingpong --example network --example rpc_echo;
      cargo build --features verbs,tokio --example async_remote_write; die "build of the examples failed"; }
  log "build done ($((SECONDS - t0)) s); booting the guest"
  mkdir -p "$W/runs"
  local d; d=$(mktemp -d "$W/runs/run.XXXXXX")
  cp "$exe" "$d/conformance"
  cp "$pingpong" "$d/pingpong"
  cp "$network" "$d/network"
  cp "$async" "$d/async_remote_write"
  cp "$rpc" "$d/rpc_echo"
  cp "$rping" "$d/rping"
  cp "$udaddy" "$d/udaddy"
  cp "$srq" "$d/srq_pingpong"
  # Small counts: the guest is emulated (a round trip of pingpong or a barrier takes
  # milliseconds there).
  local rounds=${RXE_PINGPONG_ROUNDS:-1000} nodes=${RXE_NETWORK_NODES:-4}
  local barriers=${RXE_NETWORK_BARRIERS:-200} rping_count=${RXE_RPING_COUNT:-10}
  local srq_iters=${RXE_SRQ_ITERS:-200}
  {
    guest_exports
    guest_step conformance env ZVERBS_CONFORMANCE_OUT=/mnt/host/rxe.tsv ./conformance --test-threads=2
    guest_step pingpong ./pingpong --backend verbs "$rounds"
    guest_step network ./network --backend verbs --nodes "$nodes" --barriers "$barriers"
    guest_mpi_step network_mpi "$nodes" ZVERBS_ROOT=127.0.0.1:29600 \
      ./network --backend verbs --bootstrap env --barriers "$barriers"
    guest_step async_remote_write ./async_remote_write --backend verbs
    # rping interop, both roles on 169.254.77.1 (rxe0's address): rdma-core's C rping
    # against examples/rping, data checked by the client (rping -V; ours always checks).
    # Each C peer in the background is bounded, so that a failed partner costs one step,
    # not the guest's whole run.
    guest_step rping_c_server sh -c "timeout 120 rping -s -a 169.254.77.1 -C $rping_count -v > rping_s.log 2>&1 &
      ./rping --backend verbs --client 169.254.77.1 --count $rping_count; rc=\$?
      wait \$!; s=\$?; echo \"rping -s (C): status \$s\"; cat rping_s.log; exit \$((rc | s))"
    guest_step rping_c_client sh -c "./rping --backend verbs --server 169.254.77.1 --count $rping_count & sleep 3
      rping -c -a 169.254.77.1 -C $rping_count -v -V; rc=\$?; echo \"rping -c (C): status \$rc\"
      wait \$!; s=\$?; exit \$((rc | s))"
    # udaddy interop: rdma-core's C udaddy serving, examples/udaddy as its client (a
    # datagram service resolved through the manager, ten datagrams each way).
    guest_step udaddy_c_server sh -c "timeout 120 udaddy -b 169.254.77.1 > udaddy_s.log 2>&1 &
      ./udaddy --backend verbs --client 169.254.77.1; rc=\$?
      wait \$!; s=\$?; echo \"udaddy -b (C): status \$s\"; cat udaddy_s.log; exit \$((rc | s))"
    # ... and the other way: examples/udaddy serving rdma-core's C client (the client
    # starts once the server says it is bound; it does not ask again).
    guest_step udaddy_c_client sh -c "./udaddy --backend verbs --server 169.254.77.1 > udaddy_srv.log 2>&1 &
      i=0; until grep -q serving udaddy_srv.log || [ \$i -ge 60 ]; do sleep 1; i=\$((i + 1)); done
      timeout 120 udaddy -s 169.254.77.1; rc=\$?; echo \"udaddy -s (C): status \$rc\"
      wait \$!; s=\$?; cat udaddy_srv.log; exit \$((rc | s))"
    guest_step rpc_echo ./rpc_echo --backend verbs --calls "$rounds" --secs 1
    # ibv_srq_pingpong interop: 16 queue pairs on one SRQ and one CQ on each side. The C
    # program uses the GID ours selects (the IPv4-mapped RoCE v2 entry), found in sysfs.
    # First rdma-core's C program serving, examples/srq_pingpong as its client ...
    printf '%s\n' 'srq_gid() { p=/sys/class/infiniband/$ZVERBS_DEVICE/ports/1; for g in $p/gids/*; do i=${g##*/}; case $(cat $g) in 0000:0000:0000:0000:0000:ffff:*) [ "$(cat $p/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && { echo $i; return; };; esac; done; echo 1; }' 'export SRQ_GID=$(srq_gid)'
    guest_step srq_c_server sh -c "timeout 120 ibv_srq_pingpong -d \$ZVERBS_DEVICE -g \$SRQ_GID -n $srq_iters > srq_s.log 2>&1 &
      ./srq_pingpong --backend verbs --client 169.254.77.1 --count $srq_iters; rc=\$?
      wait \$!; s=\$?; echo \"ibv_srq_pingpong (C server): status \$s\"; cat srq_s.log; exit \$((rc | s))"
    # ... and the other way: examples/srq_pingpong serving rdma-core's C client.
    guest_step srq_c_client sh -c "./srq_pingpong --backend verbs --server 0.0.0.0 --count $srq_iters > srq_srv.log 2>&1 &
      i=0; until grep -q serving srq_srv.log || [ \$i -ge 60 ]; do sleep 1; i=\$((i + 1)); done
      timeout 120 ibv_srq_pingpong -d \$ZVERBS_DEVICE -g \$SRQ_GID -n $srq_iters 169.254.77.1; rc=\$?
      echo \"ibv_srq_pingpong (C client): status \$rc\"; wait \$!; s=\$?; cat srq_srv.log; exit \$((rc | s))"
  } > "$d/test.sh"
  boot_share "$d"
  local out=$W/outcomes; mkdir -p "$out"; rm -f "$out"/{rxe,sim}.tsv
  local grc=0
  step_status "$d" conformance || grc=$?
  [ -f "$d/rxe.tsv" ] && cp "$d/rxe.tsv" "$out/rxe.tsv"
  log "guest leg: ${GUEST_SECONDS} s (boot, conformance suite, examples); in the guest:"
  [ -f "$d/times" ] && awk '{ printf "rxe-test:   %-12s %6.1f s\n", $1, $3 - $2 }' "$d/times" >&2
  log "running the same scenarios on the simulator"
  local src=0
  ZVERBS_CONFORMANCE_OUT="$out/sim.tsv" cargo test -q --features sim,tokio --test conformance_sim || src=$?
  touch "$out/rxe.tsv" "$out/sim.tsv"
  echo
  echo "== differential report: conformance scenarios on the simulator and on rxe =="
  local trc=0
  table "$out/sim.tsv" "$out/rxe.tsv" || trc=$?
  grep -q . "$out/rxe.tsv" || { log "no rxe outcomes recorded"; grc=${grc/#0/1}; }
  # The guest's other steps, each under its heading; `alloc`: its last line must say it
  # allocated nothing after setup.
  local statuses="" bad=0
  report() {
    local rc=0
    echo
    echo "== $2 =="
    step_status "$d" "$1" || rc=$?
    if [ "$rc" = 0 ] && [ "${3:-}" = alloc ] &&
      [ "$(tail -n 1 "$d/$1.out")" != "allocations_after_setup=0" ]; then
      log "$1 allocated on the data path"; rc=1
    fi
    statuses+="; $1: status $rc"
    [ "$rc" = 0 ] || bad=1
  }
  report pingpong "examples on rxe0: pingpong --backend verbs $rounds" alloc
  report network "examples on rxe0: network --backend verbs --nodes $nodes --barriers $barriers"
  report network_mpi "examples on rxe0: mpirun -n $nodes network --backend verbs --bootstrap env --barriers $barriers"
  report rping_c_server "rping interop on rxe0: rping -s (rdma-core's C program) / examples/rping --client"
  report rping_c_client "rping interop on rxe0: examples/rping --server / rping -c -V (rdma-core's C program)"
  report udaddy_c_server "udaddy interop on rxe0: udaddy -b (rdma-core's C program) / examples/udaddy --client"
  report udaddy_c_client "udaddy interop on rxe0: examples/udaddy --server / udaddy -s (rdma-core's C program)"
  report async_remote_write "examples on rxe0: async_remote_write --backend verbs"
  report rpc_echo "examples on rxe0: rpc_echo --backend verbs --calls $rounds --secs 1" alloc
  report srq_c_server "ibv_srq_pingpong interop on rxe0: the C program serving / examples/srq_pingpong --client"
  report srq_c_client "ibv_srq_pingpong interop on rxe0: examples/srq_pingpong --server / the C program as client"
  echo
  log "conformance on rxe: status $grc; on the simulator: status $src; sim-rxe vs rxe table: status $trc$statuses"
  [ "${RXE_KEEP:-0}" = 1 ] && log "kept $d" || rm -rf "$d"
  [ "$grc" = 0 ] && [ "$src" = 0 ] && [ "$trc" = 0 ] && [ "$bad" = 0 ]
}

case "${1:-}" in
  "") conformance ;;
  --image) build_image; ls -la "$W/out" ;;
  --can-run) can_run ;;
  --shell) build_image; mkdir -p "$W/runs"; boot "$(mktemp -d "$W/runs/shell.XXXXXX")" shell ;;
  --run|--mpi)
    n=0
    if [ "$1" = --mpi ]; then
      [ $# -ge 3 ] && [[ $2 =~ ^[1-9][0-9]*$ ]] || die "usage: $0 --mpi N PROGRAM [ARGS...]"
      n=$2; shift
    fi
    shift
    [ $# -ge 1 ] || die "usage: $0 --run PROGRAM [ARGS...]"
    build_image
    rc=0; run_in_guest "$n" "$@" || rc=$?
    [ "${RXE_KEEP:-0}" = 1 ] && log "kept $LAST_RUN" || rm -rf "$LAST_RUN"
    exit "$rc"
    ;;
  -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" ;;
  *) die "unknown option $1 (see --help)" ;;
esac
