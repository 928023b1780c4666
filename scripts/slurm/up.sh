#!/usr/bin/env bash
# Stand up a real single-machine Slurm cluster (cluster "trainyard", nodes n[1-4])
# from Debian packages, for development and CI. Idempotent: a second run finds the
# daemons running and only re-checks the cluster.
#
#   scripts/slurm/up.sh [STATE_DIR]      (default /tmp/trainyard-slurm)
#
# Needs: root, Debian 12 (apt-get), a cgroup v1 memory controller at /sys/fs/cgroup.
# Set TRAINYARD_SLURM_GRES=0 to leave out the fake "gpu" GRES on n3,n4.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

STATE_DIR=${1:-/tmp/trainyard-slurm}
case $STATE_DIR in /*) ;; *) STATE_DIR="$(pwd)/$STATE_DIR" ;; esac
ETC=$STATE_DIR/etc
LOG=$STATE_DIR/log
RUN=$STATE_DIR/run
SLURM_CONF=$ETC/slurm.conf
export SLURM_CONF
NODES=(n1 n2 n3 n4)
GRES=${TRAINYARD_SLURM_GRES:-1}
READY_TIMEOUT=${TRAINYARD_SLURM_READY_TIMEOUT:-60}   # seconds for nodes to turn idle
SMOKE_TIMEOUT=${TRAINYARD_SLURM_SMOKE_TIMEOUT:-60}   # seconds for the smoke job

# The last lines of a log, less the known noise (pmix, hwloc).
logtail() { [ -f "$1" ] && grep -v -i -e pmix -e 'mpi:' -e hwloc "$1" | tail -"$2"; }
log() { printf '[slurm-up] %s\n' "$*" >&2; }
die() { printf '[slurm-up] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck disable=SC2154  # rc is assigned inside the trap
trap 'rc=$?; [ $rc -eq 0 ] || printf "[slurm-up] FAILED (exit %s); see logs in %s\n" "$rc" "$LOG" >&2' EXIT

[ "$(id -u)" -eq 0 ] || die "must run as root (starts munged, slurmctld and slurmd, writes cgroups)"
command -v apt-get >/dev/null || die "apt-get not found: these scripts need Debian (12)"
[ -d /sys/fs/cgroup/memory ] || [ -f /sys/fs/cgroup/cgroup.controllers ] \
  || die "no memory cgroup controller under /sys/fs/cgroup"

[ -n "$(slurm_python)" ] || die "python3 is needed to read squeue --json"

T0=$(now)
mkdir -p "$STATE_DIR"

# --- 1. packages -----------------------------------------------------------------
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'; }
PKGS=(slurmctld slurmd slurm-client munge)
missing=()
for p in "${PKGS[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]} (apt-get update first)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >"$STATE_DIR/apt.log" 2>&1 || { tail -20 "$STATE_DIR/apt.log" >&2; die "apt-get update failed"; }
  extra=()
  if ! installed slurmrestd && apt-cache show slurmrestd >/dev/null 2>&1; then extra+=(slurmrestd); fi
  [ ${#extra[@]} -eq 0 ] || log "also installing: ${extra[*]}"
  apt-get install -y -q --no-install-recommends "${PKGS[@]}" "${extra[@]}" >>"$STATE_DIR/apt.log" 2>&1 \
    || { tail -30 "$STATE_DIR/apt.log" >&2; die "apt-get install failed (log: $STATE_DIR/apt.log)"; }
  rm -f "$STATE_DIR/apt.log"
  log "packages installed in $(since "$T0") s"
fi
for b in slurmctld slurmd sbatch squeue sinfo scontrol munged; do
  command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || die "$b not found after install"
done

mkdir -p "$ETC" "$LOG" "$RUN" "$STATE_DIR/state" "$STATE_DIR/jobs"
for n in "${NODES[@]}"; do mkdir -p "$STATE_DIR/spool/$n"; done

# --- 2. munge --------------------------------------------------------------------
munged_running() { pgrep -x munged >/dev/null 2>&1 && [ -S /run/munge/munge.socket.2 ]; }
# Record once, before this cluster starts anything, whether munged was already up;
# down.sh stops munged only if it was not.
if [ ! -f "$STATE_DIR/munged.preexisting" ]; then
  if munged_running; then echo yes >"$STATE_DIR/munged.preexisting"; else echo no >"$STATE_DIR/munged.preexisting"; fi
fi
if [ ! -s /etc/munge/munge.key ]; then
  log "creating /etc/munge/munge.key"
  install -d -o munge -g munge -m 700 /etc/munge
  if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key --force >&2
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
fi
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge
install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge 2>/dev/null || true
if ! munged_running; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged || die "munged did not start (see /var/log/munge/munged.log)"
  for _ in $(seq 50); do munged_running && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null 2>&1 || die "munge round trip failed (munge -n | unmunge)"

# --- 3. configuration ------------------------------------------------------------
# Fake GPUs for the "gpu" partition. Slurm's gpu plugin drops a GPU without File=, and
# wants File= to be a character or block device: two nodes of /dev/null's numbers
# (c 1 3) under STATE_DIR/dev stand in for /dev/nvidia0,1. Nothing opens them.
gres_node="" gres_types=""
if [ "$GRES" = 1 ]; then
  mkdir -p "$STATE_DIR/dev"
  for i in 0 1; do
    f=$STATE_DIR/dev/fakegpu$i
    [ -c "$f" ] || { rm -f "$f"; mknod -m 666 "$f" c 1 3 2>/dev/null; } || true
    [ -c "$f" ] || { log "WARNING: cannot mknod $f: no fake GPUs (set TRAINYARD_SLURM_GRES=0 to silence)"; GRES=0; }
  done
fi
if [ "$GRES" = 1 ]; then gres_types="GresTypes=gpu"; gres_node="Gres=gpu:fake:2"; fi

new_conf=$(cat <<CONF
# Written by scripts/slurm/up.sh: a development cluster on one machine.
ClusterName=trainyard
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=17000
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=30
CryptoType=crypto/munge
MpiDefault=none
StateSaveLocation=$STATE_DIR/state
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
JobAcctGatherFrequency=5
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ReturnToService=1
MinJobAge=3600
KillWait=5
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
Waittime=0
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=5
$gres_types
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=2 RealMemory=2000 State=UNKNOWN
NodeName=n[3-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17003-17004] CPUs=2 RealMemory=2000 $gres_node State=UNKNOWN
PartitionName=debug Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=n[3-4] Default=NO MaxTime=INFINITE State=UP
CONF
)
new_cgroup=$(cat <<CONF
CgroupPlugin=autodetect
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainDevices=no
ConstrainRAMSpace=yes
ConstrainSwapSpace=yes
AllowedSwapSpace=0
CONF
)
new_gres=$(cat <<CONF
AutoDetect=off
NodeName=n[3-4] Name=gpu Type=fake File=$STATE_DIR/dev/fakegpu[0-1]
CONF
)

daemon_alive() { pid_of "$1" "$2" >/dev/null; }
any_running=0
daemon_alive "$RUN/slurmctld.pid" slurmctld && any_running=1
for n in "${NODES[@]}"; do daemon_alive "$RUN/slurmd-$n.pid" slurmd && any_running=1; done

differs() {  # differs FILE CONTENT
  ! { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }
}
write() { printf '%s\n' "$2" >"$1.tmp" && mv "$1.tmp" "$1"; }
changed=0
differs "$SLURM_CONF" "$new_conf" && changed=1
differs "$ETC/cgroup.conf" "$new_cgroup" && changed=1
if [ "$GRES" = 1 ]; then differs "$ETC/gres.conf" "$new_gres" && changed=1
elif [ -f "$ETC/gres.conf" ]; then changed=1; fi
if [ $changed = 1 ] && [ $any_running = 1 ]; then
  die "the configuration for $ETC differs from the running cluster's: run scripts/slurm/down.sh $STATE_DIR first"
fi
if [ $changed = 1 ]; then
  write "$SLURM_CONF" "$new_conf"
  write "$ETC/cgroup.conf" "$new_cgroup"
  if [ "$GRES" = 1 ]; then write "$ETC/gres.conf" "$new_gres"; else rm -f "$ETC/gres.conf"; fi
fi

# --- 4. daemons ------------------------------------------------------------------
if ! daemon_alive "$RUN/slurmctld.pid" slurmctld; then
  log "starting slurmctld"
  slurmctld -f "$SLURM_CONF" >>"$LOG/slurmctld.stdout" 2>&1 \
    || { logtail "$LOG/slurmctld.log" 20 >&2; die "slurmctld failed to start"; }
fi
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
scontrol ping 2>/dev/null | grep -q UP || { logtail "$LOG/slurmctld.log" 20 >&2; die "slurmctld does not answer (scontrol ping)"; }
for n in "${NODES[@]}"; do
  if ! daemon_alive "$RUN/slurmd-$n.pid" slurmd; then
    log "starting slurmd -N $n"
    slurmd -f "$SLURM_CONF" -N "$n" >>"$LOG/slurmd-$n.stdout" 2>&1 \
      || { logtail "$LOG/slurmd-$n.log" 20 >&2; die "slurmd -N $n failed to start"; }
  fi
done

# --- 5. wait for the nodes -------------------------------------------------------
deadline=$(( $(date +%s) + READY_TIMEOUT ))
while :; do
  states=$(sinfo -h -N -p debug -o '%N %T' 2>/dev/null | sort -u || true)
  idle=$(printf '%s\n' "$states" | awk '$2 == "idle" || $2 == "mixed" || $2 == "allocated" || $2 == "completing"' | wc -l)
  [ "$idle" -eq ${#NODES[@]} ] && break
  # A node left down from an earlier run (e.g. after a kill): bring it back.
  for n in $(printf '%s\n' "$states" | awk '$2 ~ /^down|^drain/ {print $1}'); do
    scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
  done
  dead=""
  for n in "${NODES[@]}"; do daemon_alive "$RUN/slurmd-$n.pid" slurmd || dead+="$n "; done
  daemon_alive "$RUN/slurmctld.pid" slurmctld || dead+="slurmctld "
  if [ -n "$dead" ] || [ "$(date +%s)" -ge "$deadline" ]; then
    {
      if [ -n "$dead" ]; then echo "daemon(s) exited: $dead(a port of 17000-17004 taken? see below)"
      else echo "nodes not idle after ${READY_TIMEOUT}s:"; fi
      printf '%s\n' "$states"
      echo "--- slurmctld.log (tail)"; logtail "$LOG/slurmctld.log" 15
      for n in "${NODES[@]}"; do echo "--- slurmd-$n.log (tail)"; logtail "$LOG/slurmd-$n.log" 8; done
    } >&2
    die "cluster did not become ready"
  fi
  sleep 0.2
done
log "4 nodes up after $(since "$T0") s"

# --- 6. smoke job ----------------------------------------------------------------
out=$STATE_DIR/jobs/smoke.out
rm -f "$out"
jid=$(sbatch --parsable -J smoke -o "$out" -e "$out" --wrap 'echo ok') || die "sbatch of the smoke job failed"
jid=${jid%%;*}
st=$(wait_final "$jid" "$SMOKE_TIMEOUT") || die "smoke job $jid not finished after ${SMOKE_TIMEOUT}s (state $st)"
[ "$st" = COMPLETED ] || { logtail "$LOG/slurmctld.log" 20 >&2; die "smoke job $jid ended $st, not COMPLETED"; }
grep -qx ok "$out" || die "smoke job $jid output is not 'ok': $(head -c 300 "$out" 2>/dev/null)"
log "smoke job $jid COMPLETED; cluster ready in $(since "$T0") s"

cat <<ENV
# Slurm cluster 'trainyard' is up. For a client:
export SLURM_CONF=$SLURM_CONF
ENV
