#!/usr/bin/env bash
# Runs tuner-bench (BO sequential and with 3 and 5 trials in flight, and
# random search) and Optuna's TPE and random sampler (and, with --gp, Optuna's
# GPSampler) on the same problems, the tuning set and the held-out set, and
# prints one combined table per set plus the targets.
#
# The Optuna virtualenv lives outside the work tree (default
# /tmp/trainyard-optuna-venv; override with TUNER_BENCH_VENV), pinned by
# requirements.txt beside this script; --gp installs requirements-gp.txt as
# well (GPSampler needs torch, TPE does not). Results go to TUNER_BENCH_OUT
# (default /tmp/trainyard-tuner-bench).
# Options: --seeds N (default 10), --trials N (default 100), --gp,
# --reuse-peers (keep the Optuna results already in the output directory).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${TUNER_BENCH_VENV:-/tmp/trainyard-optuna-venv}"
out="${TUNER_BENCH_OUT:-/tmp/trainyard-tuner-bench}"
seeds=10
trials=100
reuse=0
gp=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds="$2"; shift 2 ;;
    --trials) trials="$2"; shift 2 ;;
    --gp) gp=1; shift ;;
    --reuse-peers) reuse=1; shift ;;
    *) echo "usage: run.sh [--seeds N] [--trials N] [--gp] [--reuse-peers]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
samplers=(tpe random)
[ "$gp" = 1 ] && samplers+=(gp)

echo "== building tuner-bench"
(cd "$root" && cargo build --release -p trainyard-tuner --bin tuner-bench)
bench="$root/target/release/tuner-bench"

have_peers=1
for s in "${samplers[@]}"; do [ -s "$out/$s.tsv" ] || have_peers=0; done
if [ "$reuse" = 1 ] && [ "$have_peers" = 1 ]; then
  echo "== reusing Optuna results in $out"
  "$bench" --seeds "$seeds" --trials "$trials" --parallel 3,5 --no-timing --tsv "$out/tuner.tsv"
else
  check='import optuna'
  [ "$gp" = 1 ] && check='import optuna, torch, scipy'
  if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "== creating $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet -r "$here/requirements.txt"
    [ "$gp" = 1 ] && "$venv/bin/pip" install --quiet -r "$here/requirements-gp.txt"
  fi
  echo "== running Optuna (${samplers[*]}, background) and tuner-bench"
  pids=()
  for s in "${samplers[@]}"; do
    "$venv/bin/python" "$here/optuna_bench.py" --sampler "$s" --seeds "$seeds" --trials "$trials" --tsv "$out/$s.tsv" >"$out/$s.log" 2>&1 &
    pids+=($!)
  done
  "$bench" --seeds "$seeds" --trials "$trials" --parallel 3,5 --no-timing --tsv "$out/tuner.tsv"
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { cat "$out/${samplers[$i]}.log"; exit 1; }
  done
fi
for s in "${samplers[@]}"; do cat "$out/$s.log" 2>/dev/null || true; done

# Timing runs after the peers so that they do not share the two cores.
echo "== timing"
"$bench" --seeds 1 --trials 50 --tsv "$out/timing.tsv" | tail -1

peer_files=()
for s in "${samplers[@]}"; do peer_files+=("$out/$s.tsv"); done
python3 "$here/combine.py" "$out/tuner.tsv" "$out/timing.tsv" "${peer_files[@]}"
