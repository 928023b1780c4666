#!/usr/bin/env python3
"""Merges the TSV outputs of tuner-bench and optuna_bench.py into one table
and checks the targets. Usage: combine.py TUNER.tsv TPE.tsv GP.tsv TIMING.tsv"""
import sys

FUNCS = ["branin", "hartmann6", "ackley5", "rosenbrock4", "mixed"]
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


def main():
    res = {}
    for p in sys.argv[1:4]:
        res.update(read(p))
    timing = read(sys.argv[4]).get(("timing", "bo"), Cells())
    print()
    print("median log10 simple regret (lower is better)")
    print(f"{'function':<12} {'method':<15} {'@10':>7} {'@25':>7} {'@50':>7}")
    for f in FUNCS:
        for key, label in METHODS:
            r = res.get((f, key), Cells())
            print(f"{f:<12} {label:<15} {r['10']:>7.2f} {r['25']:>7.2f} {r['50']:>7.2f}")
    print()
    print(f"BO time per suggestion: {timing['ms50']:.1f} ms at 50 trials, "
          f"{timing['ms100']:.1f} ms at 100 trials")
    print()
    print("targets (at 50 trials unless stated):")
    res = {k: res.get(k, Cells()) for k in [(f, m) for f in FUNCS for m, _ in METHODS]}
    beats_random = [f for f in FUNCS if res[(f, "bo")]["50"] < res[(f, "random")]["50"]]
    best_peer = {f: min(res[(f, "tpe")]["50"], res[(f, "gp")]["50"]) for f in FUNCS}
    within = [f for f in FUNCS if res[(f, "bo")]["50"] <= best_peer[f] + 0.5]
    ahead = [f for f in FUNCS if res[(f, "bo")]["50"] < best_peer[f]]
    branin35 = res[("branin", "bo")]["35"]
    ms100 = timing["ms100"]
    checks = [
        ("better than random on every function", len(beats_random) == len(FUNCS), f"{len(beats_random)}/5: {', '.join(beats_random)}"),
        ("within 0.5 log10 of the best peer on >= 4 of 5", len(within) >= 4, f"{len(within)}/5: {', '.join(within)}"),
        ("ahead of every peer on >= 2", len(ahead) >= 2, f"{len(ahead)}/5: {', '.join(ahead) or '-'}"),
        ("Branin regret below 1e-3 by trial 35", branin35 < -3, f"median log10 regret at 35 = {branin35:.2f}"),
        ("under 50 ms per suggestion at 100 trials", ms100 < 50, f"{ms100:.1f} ms"),
    ]
    for name, ok, detail in checks:
        print(f"  [{'MET' if ok else 'MISSED'}] {name} ({detail})")


if __name__ == "__main__":
    main()
