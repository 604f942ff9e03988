#!/usr/bin/env bash
# Runs examples/bootstrap_check under real launchers on this host, four ranks each:
# Open MPI's mpirun, MPICH's mpiexec (Hydra), and Slurm's srun on a one-machine cluster
# started here (munged, slurmctld, slurmd, with a slurm.conf generated under
# target/slurm/) and stopped at the end. Each leg passes when every rank prints the
# same digest of the gathered table, ranks 0..3, world 4, and the launcher it was run
# under; a leg that cannot run here prints `SKIPPED: <reason>` (never a silent pass).
#
#   scripts/launcher-test.sh [openmpi] [mpich] [slurm]     # default: all three
#
# Installs Debian's openmpi-bin, mpich, slurm-wlm and munge if missing (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."

legs=("$@")
[ ${#legs[@]} -gt 0 ] || legs=(openmpi mpich slurm)
RANKS=4

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
need=()
command -v mpirun.openmpi >/dev/null 2>&1 || need+=(openmpi-bin)
command -v mpiexec.mpich >/dev/null 2>&1 || need+=(mpich)
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"; } \
    >/dev/null 2>&1 || echo "launcher-test: could not install ${need[*]}" >&2
fi

cargo build --release --example bootstrap_check
bin=target/release/examples/bootstrap_check
# A port below the ephemeral range, different per run.
port=$((20000 + RANDOM % 10000))
failed=0

# check LEG LAUNCHER OUTPUT_FILE: four lines, ranks 0..3, world 4, one digest.
check() {
  local leg=$1 launcher=$2 out=$3
  local n ranks digests
  n=$(grep -c '^bootstrap_check ' "$out" || true)
  ranks=$(sed -n 's/^bootstrap_check rank=\([0-9]*\) world='"$RANKS"' launcher='"$launcher"' .*/\1/p' "$out" | sort -n | tr '\n' ' ')
  digests=$(sed -n 's/.* digest=\([0-9a-f]*\)$/\1/p' "$out" | sort -u | wc -l)
  if [ "$n" = "$RANKS" ] && [ "$ranks" = "0 1 2 3 " ] && [ "$digests" = 1 ]; then
    echo "launcher-test: $leg: PASS (4 ranks, one digest: $(sed -n 's/.* digest=//p' "$out" | head -1))"
  else
    echo "launcher-test: $leg: FAIL" >&2
    cat "$out" >&2
    failed=1
  fi
}

skip() { echo "launcher-test: $1: SKIPPED: $2"; }

leg_openmpi() {
  command -v mpirun.openmpi >/dev/null 2>&1 || { skip openmpi "mpirun.openmpi not installed"; return; }
  local out; out=$(mktemp)
  timeout 120 mpirun.openmpi --allow-run-as-root --oversubscribe -n $RANKS \
    -x ZVERBS_ROOT=127.0.0.1:$((port + 1)) "$bin" >"$out" 2>&1 || true
  check openmpi OpenMpi "$out"
  rm -f "$out"
}

leg_mpich() {
  command -v mpiexec.mpich >/dev/null 2>&1 || { skip mpich "mpiexec.mpich not installed"; return; }
  local out; out=$(mktemp)
  timeout 120 mpiexec.mpich -n $RANKS -env ZVERBS_ROOT 127.0.0.1:$((port + 2)) "$bin" >"$out" 2>&1 || true
  check mpich Mpich "$out"
  rm -f "$out"
}

leg_slurm() {
  local d; d="$(pwd)/target/slurm"
  local sbin=/usr/sbin
  [ -x $sbin/slurmctld ] && [ -x $sbin/slurmd ] && [ -x $sbin/munged ] && command -v srun >/dev/null 2>&1 \
    || { skip slurm "slurm-wlm or munge not installed"; return; }
  [ "$(id -u)" -eq 0 ] || { skip slurm "the one-machine cluster runs its daemons as root"; return; }
  rm -rf "$d"; mkdir -p "$d"/munge "$d"/state "$d"/spool "$d"/log
  # The munge key comes before munged starts.
  head -c 1024 /dev/urandom >"$d/munge/munge.key"; chmod 600 "$d/munge/munge.key"
  local host; host=$(hostname)
  cat >"$d/slurm.conf" <<CONF
ClusterName=zverbs
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=socket=$d/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
SlurmctldPort=$((port + 3))
SlurmdPort=$((port + 4))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
NodeName=$host CPUs=$RANKS State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
  export SLURM_CONF="$d/slurm.conf"
  stop_slurm() {
    for p in "$d/slurmd.pid" "$d/slurmctld.pid" "$d/munge/pid"; do
      [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
    done
  }
  trap stop_slurm RETURN
  if ! $sbin/munged --force --key-file="$d/munge/munge.key" --socket="$d/munge/socket" \
      --pid-file="$d/munge/pid" --log-file="$d/log/munge.log" --seed-file="$d/munge/seed"; then
    skip slurm "munged did not start ($d/log/munge.log)"; return
  fi
  $sbin/slurmctld >/dev/null 2>&1 || { skip slurm "slurmctld did not start ($d/log)"; return; }
  $sbin/slurmd >/dev/null 2>&1 || { skip slurm "slurmd did not start ($d/log)"; return; }
  local up=0
  for _ in $(seq 1 50); do
    if sinfo -h -o %T 2>/dev/null | grep -q idle; then up=1; break; fi
    sleep 0.2
  done
  [ "$up" = 1 ] || { skip slurm "the node did not come up ($d/log)"; return; }
  local out; out=$(mktemp)
  # The root: the step's first node, at a port derived from the job and step ids.
  timeout 120 srun -n $RANKS "$bin" >"$out" 2>&1 || true
  check slurm Slurm "$out"
  rm -f "$out"
}

for leg in "${legs[@]}"; do
  case "$leg" in
    openmpi) leg_openmpi ;;
    mpich) leg_mpich ;;
    slurm) leg_slurm ;;
    *) echo "launcher-test: unknown leg $leg (openmpi, mpich, slurm)" >&2; exit 2 ;;
  esac
done
exit $failed
