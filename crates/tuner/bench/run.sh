#!/usr/bin/env bash
# Runs tuner-bench (BO and random search) and the Optuna peers (TPE, GP) on
# the same five problems and prints one combined table plus the targets.
#
# The Optuna virtualenv lives outside the work tree (default
# /tmp/trainyard-optuna-venv; override with TUNER_BENCH_VENV), pinned by
# requirements.txt beside this script. Results go to TUNER_BENCH_OUT
# (default /tmp/trainyard-tuner-bench).
# Options: --seeds N (default 10), --trials N (default 50), --reuse-peers
# (keep the Optuna results already in the output directory).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${TUNER_BENCH_VENV:-/tmp/trainyard-optuna-venv}"
out="${TUNER_BENCH_OUT:-/tmp/trainyard-tuner-bench}"
seeds=10
trials=50
reuse=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds="$2"; shift 2 ;;
    --trials) trials="$2"; shift 2 ;;
    --reuse-peers) reuse=1; shift ;;
    *) echo "usage: run.sh [--seeds N] [--trials N] [--reuse-peers]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"

echo "== building tuner-bench"
(cd "$root" && cargo build --release -p trainyard-tuner --bin tuner-bench)
bench="$root/target/release/tuner-bench"

if [ "$reuse" = 1 ] && [ -s "$out/tpe.tsv" ] && [ -s "$out/gp.tsv" ]; then
  echo "== reusing Optuna results in $out"
  "$bench" --seeds "$seeds" --trials "$trials" --no-timing --tsv "$out/tuner.tsv"
else
  if ! "$venv/bin/python" -c 'import optuna, torch, scipy' 2>/dev/null; then
    echo "== creating $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet -r "$here/requirements.txt"
  fi
  echo "== running Optuna TPE and GP (background) and tuner-bench"
  "$venv/bin/python" "$here/optuna_bench.py" --sampler tpe --seeds "$seeds" --trials "$trials" --tsv "$out/tpe.tsv" >"$out/tpe.log" 2>&1 &
  tpe_pid=$!
  "$venv/bin/python" "$here/optuna_bench.py" --sampler gp --seeds "$seeds" --trials "$trials" --tsv "$out/gp.tsv" >"$out/gp.log" 2>&1 &
  gp_pid=$!
  "$bench" --seeds "$seeds" --trials "$trials" --no-timing --tsv "$out/tuner.tsv"
  wait "$tpe_pid" || { cat "$out/tpe.log"; exit 1; }
  wait "$gp_pid" || { cat "$out/gp.log"; exit 1; }
fi
cat "$out/tpe.log" "$out/gp.log" 2>/dev/null || true

# Timing runs after the peers so that they do not share the two cores.
echo "== timing"
"$bench" --seeds 1 --trials 50 --tsv "$out/timing.tsv" | tail -1

python3 "$here/combine.py" "$out/tuner.tsv" "$out/tpe.tsv" "$out/gp.tsv" "$out/timing.tsv"
