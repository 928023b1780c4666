#!/usr/bin/env bash
# Tear down the cluster that scripts/slurm/up.sh started: cancel every job, stop the
# slurmd's and slurmctld, kill anything left in the nodes' cgroups, remove those cgroup
# dirs, and stop munged unless it was already running before up.sh. Idempotent.
#
#   scripts/slurm/down.sh [STATE_DIR]    (default /tmp/trainyard-slurm)
#
# Logs and the saved controller state stay in STATE_DIR for a look afterwards.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

STATE_DIR=${1:-/tmp/trainyard-slurm}
case $STATE_DIR in /*) ;; *) STATE_DIR="$(pwd)/$STATE_DIR" ;; esac
RUN=$STATE_DIR/run
export SLURM_CONF=$STATE_DIR/etc/slurm.conf
NODES=(n1 n2 n3 n4)

log() { printf '[slurm-down] %s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "ERROR: must run as root"; exit 1; }

stop_pid() {  # stop_pid PID NAME: TERM, up to 5 s, then KILL
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do pid_alive "$pid" || return 0; sleep 0.1; done
  log "$2 (pid $pid) ignored TERM for 5 s: KILL"
  kill -KILL "$pid" 2>/dev/null
  for _ in $(seq 20); do pid_alive "$pid" || return 0; sleep 0.1; done
  log "WARNING: $2 (pid $pid) still alive after KILL"; return 1
}

# --- 1. cancel every job while the controller still answers ----------------------
if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null && [ -f "$SLURM_CONF" ]; then
  ids=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
  if [ -n "${ids// /}" ]; then
    log "cancelling jobs: $ids"
    # shellcheck disable=SC2086
    scancel --full $ids 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

# --- 2. stop the daemons, all at once --------------------------------------------
pids=()
for n in "${NODES[@]}"; do
  if p=$(pid_of "$RUN/slurmd-$n.pid" slurmd); then stop_pid "$p" "slurmd $n" & pids+=($!); fi
done
if p=$(pid_of "$RUN/slurmctld.pid" slurmctld); then stop_pid "$p" slurmctld & pids+=($!); fi
[ ${#pids[@]} -gt 0 ] && log "stopping ${#pids[@]} daemon(s)"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
rm -f "$RUN"/slurmd-*.pid "$RUN"/slurmctld.pid

# --- 3. whatever is left in the nodes' cgroups (job processes, slurmstepd) --------
cg_dirs() {  # this cluster's cgroup trees: slurm_<node> in every v1 hierarchy
  local n; for n in "${NODES[@]}"; do
    for d in /sys/fs/cgroup/*/slurm_"$n" /sys/fs/cgroup/slurm_"$n"; do [ -d "$d" ] && echo "$d"; done
  done
}
cg_pids() { cg_dirs | while read -r d; do find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null; done | sort -un; }
for _ in 1 2 3; do
  left=()
  for p in $(cg_pids); do pid_alive "$p" && left+=("$p"); done
  [ ${#left[@]} -eq 0 ] && break
  log "killing ${#left[@]} leftover process(es) in slurm cgroups: ${left[*]}"
  # Thaw first: a frozen (suspended) task would not die.
  for f in /sys/fs/cgroup/freezer/slurm_n*/; do
    [ -d "$f" ] && find "$f" -name freezer.state -exec sh -c 'echo THAWED > "$1"' _ {} \; 2>/dev/null
  done
  kill -KILL "${left[@]}" 2>/dev/null
  for _ in $(seq 30); do
    still=0; for p in "${left[@]}"; do pid_alive "$p" && still=1; done
    [ $still = 0 ] && break; sleep 0.1
  done
done
for d in $(cg_dirs); do
  find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
  [ -d "$d" ] && { log "WARNING: could not remove cgroup $d"; rc=1; }
done

# --- 4. munged: stop it only if up.sh started it ---------------------------------
mark=$STATE_DIR/munged.preexisting
if [ -f "$mark" ]; then
  if [ "$(cat "$mark")" = no ]; then
    mp=""
    [ -f /run/munge/munged.pid ] && mp=$(cat /run/munge/munged.pid 2>/dev/null)
    if [ -n "$mp" ] && pid_alive "$mp" && [ "$(cat "/proc/$mp/comm" 2>/dev/null)" = munged ]; then
      log "stopping munged (started by up.sh)"
      stop_pid "$mp" munged || rc=1
    fi
  fi
  rm -f "$mark"
fi

if [ $rc -eq 0 ]; then log "down"; else log "down, with warnings above"; fi
exit $rc
