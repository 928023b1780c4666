#!/usr/bin/env python3
"""Optuna peers for tuner-bench: TPESampler and GPSampler on the same
problems, the tuning set and the held-out set (see tuner-bench.rs for the list), same objectives, same noise,
same regret definition (median over seeds of log10 of the noise-free value
of the best observed trial minus the known optimum, floored at 1e-12), 50
trials, 10 seeds. TPE needs only optuna; GPSampler needs torch as well.

Usage: optuna_bench.py [--sampler tpe|gp|all] [--seeds N] [--trials N]
                       [--only NAME,...] [--tsv PATH]
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


def levy10(p):
    w = [1 + (p[f"x{i}"] - 1) / 4 for i in range(10)]
    f = math.sin(math.pi * w[0]) ** 2
    for i in range(9):
        f += (w[i] - 1) ** 2 * (1 + 10 * math.sin(math.pi * w[i] + 1) ** 2)
    return f + (w[9] - 1) ** 2 * (1 + math.sin(2 * math.pi * w[9]) ** 2)


def styblinski4(p):
    return sum(0.5 * (x**4 - 16 * x * x + 5 * x) for x in (p[f"x{i}"] for i in range(4)))


def michalewicz5(p):
    return -sum(math.sin(x) * math.sin((i + 1) * x * x / math.pi) ** 20 for i, x in enumerate(p[f"x{i}"] for i in range(5)))


GRIEWANK_SHIFT = [73.3, -121.7, 45.1, -210.9, 160.2, -12.4]


def griewank6(p):
    s, prod = 0.0, 1.0
    for i in range(6):
        z = p[f"x{i}"] - GRIEWANK_SHIFT[i]
        s += z * z / 4000
        prod *= math.cos(z / math.sqrt(i + 1))
    return 1 + s - prod


RASTRIGIN_SHIFT = [1.2, -0.7, 2.1, -1.6]


def rastrigin4(p):
    total = 0.0
    for i in range(4):
        z = p[f"x{i}"] - RASTRIGIN_SHIFT[i]
        total += z * z - 10 * math.cos(2 * math.pi * z) + 10
    return total


def intheavy6(p):
    u0 = (p["k0"] - 31) / 8
    u1 = math.log(p["k1"] / 12)
    u2 = (p["k2"] - 7) / 5
    u3 = p["k3"] - 3 + u2
    u4 = math.log(p["k4"] / 150)
    u5 = p["x5"] - 0.3
    return u0 * u0 + u1 * u1 + 0.3 * u0 * u1 + u2 * u2 + 0.5 * u3 * u3 + u4 * u4 + 4 * u5 * u5


def intheavy_sample(trial):
    return {
        "k0": trial.suggest_int("k0", 0, 50),
        "k1": trial.suggest_int("k1", 1, 64, log=True),
        "k2": trial.suggest_int("k2", -20, 20),
        "k3": trial.suggest_int("k3", 0, 10),
        "k4": trial.suggest_int("k4", 1, 1000, log=True),
        "x5": trial.suggest_float("x5", 0.0, 1.0),
    }


MASK = (1 << 64) - 1


def splitmix64(state):
    """One SplitMix64 step: (new state, output), as in tuner-bench."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def noise(seed, t):
    """Standard normal noise for trial t of the study with seed, bit for bit
    the one tuner-bench adds, so both sides see the same noise."""
    st = (seed * 1_000_003 + t) & MASK
    st, a = splitmix64(st)
    st, b = splitmix64(st)
    u1 = ((a >> 11) + 1.0) / float(1 << 53)
    u2 = (b >> 11) / float(1 << 53)
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


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


# (name, sampler of the space, objective, known optimum, noise sd)
PROBLEMS = [
    ("branin", branin_sample, branin, 0.39788735772973816, 0.0),
    ("hartmann6", box(6, 0.0, 1.0), hartmann6, -3.32236801141551, 0.0),
    ("ackley5", box(5, -5.0, 5.0), ackley5, 0.0, 0.0),
    ("rosenbrock4", box(4, -2.0, 2.0), rosenbrock4, 0.0, 0.0),
    ("rosenbrock4w", box(4, -5.0, 10.0), rosenbrock4, 0.0, 0.0),
    ("mixed", mixed_sample, mixed, 0.0, 0.0),
    ("levy10", box(10, -10.0, 10.0), levy10, 0.0, 0.0),
    ("styblinski4", box(4, -5.0, 5.0), styblinski4, -39.16616570377142 * 4, 0.0),
    ("michalewicz5", box(5, 0.0, math.pi), michalewicz5, -4.687658179, 0.0),
    ("griewank6", box(6, -600.0, 600.0), griewank6, 0.0, 0.0),
    ("rastrigin4", box(4, -5.12, 5.12), rastrigin4, 0.0, 0.0),
    ("hartmann6n", box(6, 0.0, 1.0), hartmann6, -3.32236801141551, 0.1),
    ("intheavy6", intheavy_sample, intheavy6, 0.0, 0.0),
]


# The held-out set (see tuner-bench.rs): never used to tune the optimiser.


def camel2(p):
    x0, x1 = p["x0"], p["x1"]
    return (4 - 2.1 * x0 * x0 + x0**4 / 3) * x0 * x0 + x0 * x1 + (-4 + 4 * x1 * x1) * x1 * x1


SHEKEL_A = [[4, 4, 4, 4], [1, 1, 1, 1], [8, 8, 8, 8], [6, 6, 6, 6], [3, 7, 3, 7],
            [2, 9, 2, 9], [5, 5, 3, 3], [8, 1, 8, 1], [6, 2, 6, 2], [7, 3.6, 7, 3.6]]
SHEKEL_C = [0.1, 0.2, 0.2, 0.4, 0.4, 0.6, 0.3, 0.7, 0.5, 0.5]


def shekel4(p):
    v = [p[f"x{i}"] for i in range(4)]
    return -sum(1 / (sum((v[j] - SHEKEL_A[i][j]) ** 2 for j in range(4)) + SHEKEL_C[i]) for i in range(10))


ELLIPSOID_SHIFT = [1.3, -2.1, 0.7, 2.6, -0.4, -1.8]


def ellipsoid6(p):
    z = [p[f"x{i}"] - ELLIPSOID_SHIFT[i] for i in range(6)]
    for i in range(6):
        for j in range(i + 1, 6):
            t = 0.3 + 0.5 * i + 0.25 * j
            c, s = math.cos(t), math.sin(t)
            z[i], z[j] = c * z[i] - s * z[j], s * z[i] + c * z[j]
    return sum(10 ** (3 * k / 5) * z[k] ** 2 for k in range(6))


WELL_CENTRE = [0.63, 0.27, 0.71, 0.38, 0.55, 0.19]


def well6(p):
    r2 = sum((p[f"x{i}"] - WELL_CENTRE[i]) ** 2 for i in range(6))
    return 0.3 * (1 - math.exp(-r2 / 0.5)) + 0.7 * (1 - math.exp(-r2 / 0.0072))


SALOMON_SHIFT = [2.1, -3.4, 1.7, -0.6, 3.3]


def salomon5(p):
    r = math.sqrt(sum((p[f"x{i}"] - SALOMON_SHIFT[i]) ** 2 for i in range(5)))
    return 1 - math.cos(2 * math.pi * r) + 0.1 * r


def dixonprice5(p):
    v = [p[f"x{i}"] for i in range(5)]
    return (v[0] - 1) ** 2 + sum((i + 1) * (2 * v[i] ** 2 - v[i - 1]) ** 2 for i in range(1, 5))


def xgb6(p):
    ue = math.log10(p["eta"]) + 1.2
    ud = (p["max_depth"] - 6) / 4
    um = (math.log2(p["min_child_weight"]) - 3) / 3
    us = (p["subsample"] - 0.8) / 0.2
    uc = (p["colsample"] - 0.6) / 0.3
    booster = {"gbtree": 0.0, "dart": 0.008}.get(p["booster"], 0.04)
    cliff = 0.2 * (ue - 0.8) if ue > 0.8 else 0.0
    return (0.12 + 0.04 * (ue + 0.4 * ud) ** 2 + 0.02 * ud * ud + 0.01 * um * um
            + 0.015 * us * us + 0.01 * uc * uc + cliff + booster)


def xgb_sample(trial):
    return {
        "eta": trial.suggest_float("eta", 1e-3, 1.0, log=True),
        "max_depth": trial.suggest_int("max_depth", 1, 15),
        "min_child_weight": trial.suggest_float("min_child_weight", 1.0, 128.0, log=True),
        "subsample": trial.suggest_float("subsample", 0.5, 1.0),
        "colsample": trial.suggest_float("colsample", 0.3, 1.0),
        "booster": trial.suggest_categorical("booster", ["gbtree", "dart", "gblinear"]),
    }


PROBLEMS += [
    ("camel2", lambda t: {"x0": t.suggest_float("x0", -3.0, 3.0), "x1": t.suggest_float("x1", -2.0, 2.0)},
     camel2, -1.031628453489877, 0.0),
    ("shekel4", box(4, 0.0, 10.0), shekel4, -10.536409816692046, 0.0),
    ("ellipsoid6", box(6, -5.0, 5.0), ellipsoid6, 0.0, 0.0),
    ("well6", box(6, 0.0, 1.0), well6, 0.0, 0.0),
    ("salomon5", box(5, -10.0, 10.0), salomon5, 0.0, 0.0),
    ("dixonprice5", box(5, -10.0, 10.0), dixonprice5, 0.0, 0.0),
    ("xgb6", xgb_sample, xgb6, 0.12, 0.0),
]


def make_sampler(name, seed):
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(name)


def log_regret(best, opt):
    return math.log10(max(best - opt, 1e-12))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sampler", default="all", choices=["tpe", "gp", "random", "all"])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--tsv")
    ap.add_argument("--only", help="comma-separated problem names")
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    samplers = ["tpe", "gp"] if args.sampler == "all" else [args.sampler]
    checkpoints = [c for c in (10, 25, 50, 100) if c <= args.trials]
    rows = []
    print(f"median log10 simple regret over {args.seeds} seeds ({args.trials} trials), optuna {optuna.__version__}")
    for name, sample, f, opt, sd in PROBLEMS:
        if args.only and name not in args.only.split(","):
            continue
        for s_name in samplers:
            at = [[] for _ in checkpoints]
            for seed in range(args.seeds):
                study = optuna.create_study(direction="minimize", sampler=make_sampler(s_name, 1000 + seed))
                best_obs = math.inf
                best_true = math.inf
                curve = []
                for t in range(args.trials):
                    trial = study.ask()
                    truth = f(sample(trial))
                    obs = truth + sd * noise(1000 + seed, t) if sd > 0 else truth
                    study.tell(trial, obs)
                    # The best trial is the one with the best observed value;
                    # its regret is measured on the noise-free function.
                    if obs < best_obs:
                        best_obs, best_true = obs, truth
                    curve.append(best_true)
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
