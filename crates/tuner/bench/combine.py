#!/usr/bin/env python3
"""Merges the TSV outputs of tuner-bench and optuna_bench.py into one table per set
(the tuning set, then the held-out set) and checks the targets.

Usage: combine.py TUNER.tsv TIMING.tsv [PEER.tsv ...]

TUNER.tsv comes from `tuner-bench --trials 100 --parallel 3,5`, the peers from
optuna_bench.py (GP, TPE, random). Each cell is the median log10 simple regret over the
seeds after 25 / 50 / 100 trials (lower is better)."""
import math
import sys

METHODS = [
    ("bo", "BO"),
    ("bo-p3", "BO, 3 in flight"),
    ("bo-p5", "BO, 5 in flight"),
    ("gp", "Optuna GP"),
    ("tpe", "Optuna TPE"),
    ("random", "random"),
]
CHECKPOINTS = ("25", "50", "100")
NAN = float("nan")


def read(path):
    """(function, method) -> {key: value}, and the functions in file order with their set."""
    rows, funcs = {}, {}
    with open(path) as fh:
        for line in fh:
            parts = line.strip().split("\t")
            if len(parts) < 3:
                continue
            vals = {}
            for p in parts[2:]:
                k, _, v = p.partition("=")
                try:
                    vals[k] = float(v)
                except ValueError:
                    pass
            rows[(parts[0], parts[1])] = vals
            if "held_out" in vals:
                funcs.setdefault(parts[0], vals["held_out"] == 1)
    return rows, funcs


def cell(r):
    return " / ".join("-" if math.isnan(r.get(c, NAN)) else f"{r[c]:.2f}" for c in CHECKPOINTS)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    res, funcs = read(sys.argv[1])
    timing = read(sys.argv[2])[0].get(("timing", "bo"), {})
    for p in sys.argv[3:]:
        peer, _ = read(p)
        # Optuna's random sampler is reported as "random" too; the tuner's own wins.
        for k, v in peer.items():
            res.setdefault(k, v)
    methods = [(m, label) for m, label in METHODS if any((f, m) in res for f in funcs)]
    get = lambda f, m, c="50": res.get((f, m), {}).get(c, NAN)
    gap = lambda f, a, b: get(f, a) - get(f, b)
    for held_out, title in ((False, "The tuning set"), (True, "The held-out set")):
        fs = [f for f, h in funcs.items() if h == held_out]
        if not fs:
            continue
        print(f"\n{title}: median log10 simple regret after {' / '.join(CHECKPOINTS)} trials\n")
        print("| function | " + " | ".join(label for _, label in methods) + " |")
        print("|---|" + "---|" * len(methods))
        for f in fs:
            best = min((get(f, m) for m, _ in methods), key=lambda v: (math.isnan(v), v))
            cells = []
            for m, _ in methods:
                c = cell(res.get((f, m), {}))
                cells.append(f"**{c}**" if get(f, m) == best else c)
            print(f"| {f} | " + " | ".join(cells) + " |")
    print(f"\nBO time per suggestion: {timing.get('ms50', NAN):.1f} ms at 50 trials, "
          f"{timing.get('ms200', NAN):.1f} ms at 200 trials")
    print("\ntargets (at 50 trials):")
    fs = [f for f in funcs if not math.isnan(get(f, "bo"))]
    if not fs:
        print("  (no BO results at 50 trials)")
        return
    checks = []
    with_gp = [f for f in fs if not math.isnan(get(f, "gp"))]
    if with_gp:
        behind = [f for f in with_gp if get(f, "bo") > get(f, "gp") + 0.1]
        ahead = [f for f in with_gp if get(f, "bo") < get(f, "gp")]
        checks += [
            ("no worse than Optuna GP (within 0.1) on any function", not behind,
             "behind on: " + (", ".join(f"{f} ({gap(f, 'bo', 'gp'):+.2f})" for f in behind) or "-")),
            ("ahead of Optuna GP on most", len(ahead) * 2 > len(with_gp), f"{len(ahead)}/{len(with_gp)}"),
        ]
    for m in ("bo-p3", "bo-p5"):
        if any((f, m) in res for f in fs):
            far = [f for f in fs if get(f, m) > get(f, "bo") + 0.3]
            checks.append((f"{m} within 0.3 of sequential on every function", not far,
                           "beyond: " + (", ".join(f"{f} ({gap(f, m, 'bo'):+.2f})" for f in far) or "-")))
    ms200 = timing.get("ms200", NAN)
    checks.append(("at most 50 ms per suggestion at 200 trials", ms200 <= 50, f"{ms200:.1f} ms"))
    for name, ok, detail in checks:
        print(f"  [{'MET' if ok else 'MISSED'}] {name} ({detail})")


if __name__ == "__main__":
    main()
