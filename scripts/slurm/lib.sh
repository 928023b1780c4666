# shellcheck shell=bash
# Helpers shared by up.sh, down.sh and check.sh (sourced, not run).

# A process is alive if it exists and is not a zombie: the sandbox's pid 1 reaps
# late, and an exited daemon lingers in state Z for a few seconds.
pid_alive() {
  local st; [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] || return 1
  st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# pid_of PIDFILE COMM: prints the pid if the file names a live process called COMM.
pid_of() {
  local pid; [ -f "$1" ] || return 1; pid=$(cat "$1" 2>/dev/null) || return 1
  pid_alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && echo "$pid"
}

slurm_python() {  # the python3 that reads squeue --json
  if [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else command -v python3; fi
}

# job_field JOBID FIELD: one field of a job from `squeue --json` (which ignores -j, so
# the filtering is done here); UNKNOWN if the job is not listed.
job_field() {
  squeue --json 2>/dev/null | "$(slurm_python)" -c '
import json, sys
jid, field = int(sys.argv[1]), sys.argv[2]
try:
    jobs = json.load(sys.stdin).get("jobs", [])
except Exception:
    jobs = []
for j in jobs:
    if j.get("job_id") == jid:
        v = j.get(field)
        print(",".join(map(str, v)) if isinstance(v, list) else v)
        break
else:
    print("UNKNOWN")' "$1" "$2"
}

SLURM_FINAL_STATES='COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED'

# wait_final JOBID TIMEOUT_S: prints the job's final state; non-zero on timeout.
wait_final() {
  local st end=$(( $(date +%s) + $2 ))
  while :; do
    st=$(job_field "$1" job_state)
    if [[ $st =~ ^($SLURM_FINAL_STATES)$ ]]; then echo "$st"; return 0; fi
    [ "$(date +%s)" -lt "$end" ] || { echo "$st"; return 1; }
    sleep 0.2
  done
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
