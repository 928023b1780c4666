#!/usr/bin/env bash
# End-to-end check of the development Slurm cluster: up.sh, a memory-limit job that
# must end OUT_OF_MEMORY, a job asking for a (fake) GPU, then down.sh, and a check
# that no slurm process and no slurm cgroup is left. Prints a summary with timings.
#
#   scripts/slurm/check.sh [STATE_DIR]   (default /tmp/trainyard-slurm)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

STATE_DIR=${1:-/tmp/trainyard-slurm}
case $STATE_DIR in /*) ;; *) STATE_DIR="$(pwd)/$STATE_DIR" ;; esac
export SLURM_CONF=$STATE_DIR/etc/slurm.conf
JOBS=$STATE_DIR/jobs

results=()   # "PASS|FAIL name detail"
failed=0
record() {  # record PASS|FAIL NAME DETAIL
  results+=("$(printf '%-4s %-22s %s' "$1" "$2" "$3")")
  [ "$1" = PASS ] || failed=1
  printf '[slurm-check] %s %s: %s\n' "$1" "$2" "$3" >&2
}
summary() {
  echo
  echo "== Slurm check summary ($STATE_DIR) =="
  printf '%s\n' "${results[@]}"
  if [ $failed = 0 ]; then echo "RESULT: all passed"; else echo "RESULT: FAILED"; fi
}

T_ALL=$(now)

# --- up ---------------------------------------------------------------------------
t=$(now)
if "$HERE/up.sh" "$STATE_DIR"; then
  t_up=$(since "$t")
  record PASS up.sh "cluster up, smoke job COMPLETED ($t_up s)"
else
  record FAIL up.sh "exit non-zero after $(since "$t") s"
  "$HERE/down.sh" "$STATE_DIR" || true
  summary; exit 1
fi

# --- memory limit -----------------------------------------------------------------
t=$(now)
out=$JOBS/oom.out; rm -f "$out"
if jid=$(sbatch --parsable -J oom -o "$out" -e "$out" --mem=100M \
          --wrap "python3 -c 'b=[bytearray(10**6) for _ in range(400)]'"); then
  jid=${jid%%;*}
  st=$(wait_final "$jid" 120)
  reason=$(job_field "$jid" state_reason)
  if [ "$st" = OUT_OF_MEMORY ]; then
    record PASS oom "job $jid OUT_OF_MEMORY, reason $reason ($(since "$t") s)"
  else
    record FAIL oom "job $jid ended $st (reason $reason), expected OUT_OF_MEMORY; output: $(tail -c 300 "$out" 2>/dev/null)"
  fi
else
  record FAIL oom "sbatch failed"
fi

# --- fake GPU (GRES) --------------------------------------------------------------
if [ -f "$STATE_DIR/etc/gres.conf" ]; then
  t=$(now)
  out=$JOBS/gpu.out; rm -f "$out"
  # shellcheck disable=SC2016  # expanded by the job, not here
  if jid=$(sbatch --parsable -J gpu -p gpu --gres=gpu:1 -o "$out" -e "$out" \
            --wrap 'echo "node=$SLURMD_NODENAME gpus=$SLURM_JOB_GPUS cuda=$CUDA_VISIBLE_DEVICES"'); then
    jid=${jid%%;*}
    st=$(wait_final "$jid" 60)
    line=$(head -1 "$out" 2>/dev/null)
    if [ "$st" = COMPLETED ] && [[ $line =~ node=n[34]\ gpus=[01] ]]; then
      record PASS gres "job $jid --gres=gpu:1 COMPLETED: $line ($(since "$t") s)"
    else
      record FAIL gres "job $jid ended $st; output: $line"
    fi
  else
    record FAIL gres "sbatch --gres=gpu:1 failed"
  fi
else
  record PASS gres "skipped: cluster has no fake GPUs (TRAINYARD_SLURM_GRES=0)"
fi

# --- down -------------------------------------------------------------------------
t=$(now)
if "$HERE/down.sh" "$STATE_DIR"; then
  record PASS down.sh "$(since "$t") s"
else
  record FAIL down.sh "exit non-zero after $(since "$t") s"
fi

# --- nothing left -----------------------------------------------------------------
# Exited daemons stay zombies until the sandbox's pid 1 reaps them (a few seconds):
# wait for `pgrep -a slurm` to be empty; fail only on a live process.
t=$(now)
for _ in $(seq 60); do [ -z "$(pgrep slurm)" ] && break; sleep 0.5; done
live=""; zombies=""
for p in $(pgrep slurm); do
  if pid_alive "$p"; then live+="$(ps -o pid=,args= -p "$p") "; else zombies+="$p "; fi
done
if [ -n "$live" ]; then
  record FAIL processes "still running: $live"
elif [ -n "$zombies" ]; then
  record PASS processes "none live; zombies not yet reaped by pid 1: $zombies"
else
  record PASS processes "pgrep -a slurm empty ($(since "$t") s)"
fi
cgs=$(find /sys/fs/cgroup /sys/fs/cgroup/*/ -maxdepth 1 -name 'slurm*' -type d 2>/dev/null | sort -u | tr '\n' ' ')
if [ -z "$cgs" ]; then record PASS cgroups "no /sys/fs/cgroup/*/slurm* dirs"
else record FAIL cgroups "left: $cgs"; fi

echo
echo "timings: up.sh ${t_up:-?} s, total $(since "$T_ALL") s"
summary
exit $failed
