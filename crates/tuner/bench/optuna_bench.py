#!/usr/bin/env python3
"""Optuna peers for tuner-bench: TPESampler and GPSampler on the same five
problems (Branin, Hartmann-6, shifted Ackley-5, Rosenbrock-4, mixed space),
same objectives, same regret definition (median over seeds of log10 of
best-so-far minus the known optimum, floored at 1e-12), 50 trials, 10 seeds.

Usage: optuna_bench.py [--sampler tpe|gp|all] [--seeds N] [--trials N] [--tsv PATH]
"""
import argparse
import math
import statistics
import sys

import warnings

import optuna

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def branin(p):
    x1, x2 = p["x0"], p["x1"]
    b = 5.1 / (4 * math.pi**2)
    c = 5 / math.pi
    t = 1 / (8 * math.pi)
    return (x2 - b * x1 * x1 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


HA = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
HP = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
]
HALPHA = [1.0, 1.2, 3.0, 3.2]


def hartmann6(p):
    v = [p[f"x{i}"] for i in range(6)]
    s = 0.0
    for i in range(4):
        inner = sum(HA[i][j] * (v[j] - HP[i][j]) ** 2 for j in range(6))
        s += HALPHA[i] * math.exp(-inner)
    return -s


ACKLEY_SHIFT = [1.0, -1.5, 0.5, 2.0, -0.8]


def ackley5(p):
    z = [p[f"x{i}"] - ACKLEY_SHIFT[i] for i in range(5)]
    s1 = sum(v * v for v in z)
    s2 = sum(math.cos(2 * math.pi * v) for v in z)
    return -20 * math.exp(-0.2 * math.sqrt(s1 / 5)) - math.exp(s2 / 5) + 20 + math.e


def rosenbrock4(p):
    v = [p[f"x{i}"] for i in range(4)]
    return sum(100 * (v[i + 1] - v[i] ** 2) ** 2 + (1 - v[i]) ** 2 for i in range(3))


def mixed(p):
    lr = math.log10(p["lr"])
    centre, penalty = {"sgd": (-1.5, 0.0), "adam": (-3.0, 0.3)}.get(p["optimizer"], (-2.5, 0.6))
    f = (lr - centre) ** 2 + 0.1 * (p["layers"] - 5) ** 2 + penalty
    if p["optimizer"] == "sgd":
        f += 4 * (p["momentum"] - 0.9) ** 2
    return f


def box(n, lo, hi):
    def sample(trial):
        return {f"x{i}": trial.suggest_float(f"x{i}", lo, hi) for i in range(n)}

    return sample


def mixed_sample(trial):
    p = {
        "lr": trial.suggest_float("lr", 1e-4, 1.0, log=True),
        "layers": trial.suggest_int("layers", 1, 8),
        "optimizer": trial.suggest_categorical("optimizer", ["sgd", "adam", "rmsprop"]),
    }
    if p["optimizer"] == "sgd":
        p["momentum"] = trial.suggest_float("momentum", 0.0, 0.99)
    return p


def branin_sample(trial):
    return {"x0": trial.suggest_float("x0", -5.0, 10.0), "x1": trial.suggest_float("x1", 0.0, 15.0)}


PROBLEMS = [
    ("branin", branin_sample, branin, 0.39788735772973816),
    ("hartmann6", box(6, 0.0, 1.0), hartmann6, -3.32236801141551),
    ("ackley5", box(5, -5.0, 5.0), ackley5, 0.0),
    ("rosenbrock4", box(4, -2.0, 2.0), rosenbrock4, 0.0),
    ("mixed", mixed_sample, mixed, 0.0),
]


def make_sampler(name, seed):
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(name)


def log_regret(best, opt):
    return math.log10(max(best - opt, 1e-12))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sampler", default="all", choices=["tpe", "gp", "all"])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--tsv")
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    samplers = ["tpe", "gp"] if args.sampler == "all" else [args.sampler]
    checkpoints = [c for c in (10, 25, 35, 50) if c <= args.trials]
    rows = []
    print(f"median log10 simple regret over {args.seeds} seeds ({args.trials} trials), optuna {optuna.__version__}")
    for name, sample, f, opt in PROBLEMS:
        for s_name in samplers:
            at = [[] for _ in checkpoints]
            for seed in range(args.seeds):
                study = optuna.create_study(direction="minimize", sampler=make_sampler(s_name, 1000 + seed))
                best = math.inf
                curve = []
                for _ in range(args.trials):
                    trial = study.ask()
                    v = f(sample(trial))
                    study.tell(trial, v)
                    best = min(best, v)
                    curve.append(best)
                for i, c in enumerate(checkpoints):
                    at[i].append(log_regret(curve[c - 1], opt))
            meds = [statistics.median(a) for a in at]
            print(f"{name:<12} {s_name:<7} " + "".join(f"{m:>8.2f}" for m in meds), flush=True)
            rows.append(f"{name}\t{s_name}\t" + "\t".join(f"{c}={m:.4f}" for c, m in zip(checkpoints, meds)))
    if args.tsv:
        with open(args.tsv, "w") as fh:
            fh.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    sys.exit(main())
