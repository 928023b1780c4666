#!/usr/bin/env python3
"""Merges the TSV outputs of tuner-bench and optuna_bench.py into one table
and checks the targets. Usage: combine.py TUNER.tsv TIMING.tsv [PEER.tsv ...]
(peer files from optuna_bench.py: TPE, and GP where torch is installed)."""
import math
import sys

FUNCS = [
    "branin", "hartmann6", "ackley5", "rosenbrock4", "rosenbrock4w", "mixed", "levy10",
    "styblinski4", "michalewicz5", "griewank6", "rastrigin4", "hartmann6n", "intheavy6",
]
METHODS = [("bo", "BO (tuner)"), ("random", "random (tuner)"), ("tpe", "Optuna TPE"), ("gp", "Optuna GP")]


NAN = float("nan")


class Cells(dict):
    """Checkpoint -> value; missing checkpoints read as NaN."""

    def __missing__(self, key):
        return NAN


def read(path):
    rows = {}
    with open(path) as fh:
        for line in fh:
            parts = line.strip().split("\t")
            if len(parts) < 3:
                continue
            vals = {k: float(v) for k, v in (p.split("=") for p in parts[2:])}
            rows[(parts[0], parts[1])] = Cells(vals)
    return rows


def cell(v, width=7, fmt=".2f"):
    return f"{'-':>{width}}" if math.isnan(v) else f"{v:>{width}{fmt}}"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    res = read(sys.argv[1])
    timing = read(sys.argv[2]).get(("timing", "bo"), Cells())
    for p in sys.argv[3:]:
        res.update(read(p))
    peers = [m for m, _ in METHODS[2:] if any((f, m) in res for f in FUNCS)]
    print()
    print("median log10 simple regret (lower is better); 'bound' = share of proposed")
    print("DOUBLE coordinates exactly on a bound")
    print(f"{'function':<13} {'method':<15} {'@10':>7} {'@25':>7} {'@50':>7} {'bound':>7}")
    for f in FUNCS:
        for key, label in METHODS:
            if key not in ("bo", "random") and key not in peers:
                continue
            r = res.get((f, key), Cells())
            b = r["bound"]
            print(f"{f:<13} {label:<15} {cell(r['10'])} {cell(r['25'])} {cell(r['50'])} "
                  f"{'' if math.isnan(b) else f'{b:>6.1f}%'}")
    print()
    print(f"BO time per suggestion: {timing['ms50']:.1f} ms at 50 trials, "
          f"{timing['ms200']:.1f} ms at 200 trials")
    print()
    print("targets (at 50 trials unless stated):")
    get = lambda f, m: res.get((f, m), Cells())["50"]
    n = len(FUNCS)
    beats_random = [f for f in FUNCS if get(f, "bo") < get(f, "random")]
    checks = [
        ("better than random on every function", len(beats_random) == n, f"{len(beats_random)}/{n}"),
    ]
    if peers:
        best_peer = {f: min((get(f, m) for m in peers), key=lambda v: (math.isnan(v), v)) for f in FUNCS}
        within = [f for f in FUNCS if get(f, "bo") <= best_peer[f] + 0.5]
        ahead = [f for f in FUNCS if get(f, "bo") < best_peer[f]]
        checks += [
            (f"within 0.5 log10 of the best peer ({', '.join(peers)}) on all but one", len(within) >= n - 1,
             f"{len(within)}/{n}; not within: {', '.join(f for f in FUNCS if f not in within) or '-'}"),
            ("ahead of every peer on at least half", len(ahead) * 2 >= n, f"{len(ahead)}/{n}"),
        ]
    branin35 = res.get(("branin", "bo"), Cells())["35"]
    on_bound = [f for f in FUNCS if res.get((f, "bo"), Cells())["bound"] > 1.0]
    checks += [
        ("Branin regret below 1e-3 by trial 35", branin35 < -3, f"median log10 regret at 35 = {branin35:.2f}"),
        ("at most 1% of BO's DOUBLE proposals on a bound, per function", not on_bound,
         f"over 1%: {', '.join(on_bound) or '-'}"),
        ("under 50 ms per suggestion at 200 trials", timing["ms200"] < 50, f"{timing['ms200']:.1f} ms"),
    ]
    for name, ok, detail in checks:
        print(f"  [{'MET' if ok else 'MISSED'}] {name} ({detail})")


if __name__ == "__main__":
    main()
