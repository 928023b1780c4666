#!/usr/bin/env python3
"""Medians over perturbed runs of trainyard-sim on one compressed trace.

Near a critical load one run is not a measurement: a few GPU-hours moved decide hours of
queue. This runs the simulator 30 times on the same trace and fleet, with the round
interval at 6..15 s and the compression at 0.967, 1 and 1.033 times the one given, and
prints the medians of the p99 wait of 1-GPU jobs (ours and EASY backfill's, from the same
runs), how many runs ours was no worse, the longest waits and our p99 of 2-8 GPU jobs.

    python3 scripts/traces/perturbed.py target/release/trainyard-sim openb.csv 12 3 [sim args...]

Arguments: the simulator, the trace (see TRACES.md), nodes, compression; the rest goes
to every run (e.g. --max-reservations 1, --starvation 3600).
"""
import os
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

INTERVALS = range(6, 16)
COMPRESSION_FACTORS = (0.967, 1.0, 1.033)


def seconds(text):
    """'5h18m', '27m55s', '0s' -> seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text))


def hours(secs):
    secs = int(secs)
    return f"{secs // 3600}h{(secs % 3600) // 60:02d}m"


def one_run(args):
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    p99 = re.search(r"p99 wait of 1-GPU jobs <= EASY's: (\S+) vs (\S+)", out)
    longest = re.search(r"longest wait <= 1.1 x EASY's: (\S+) vs (\S+)", out)
    # The wait table's row of our policy (the last row that starts so); its sixth column
    # is the p99 wait of 2-8 GPU jobs.
    ours = re.findall(r"^\| trainyard \|[^\n]*", out, re.M)
    if not (p99 and longest and ours):
        sys.exit(f"unexpected output of {' '.join(args)}:\n{out}")
    return {
        "ours": seconds(p99.group(1)),
        "easy": seconds(p99.group(2)),
        "longest_ours": seconds(longest.group(1)),
        "longest_easy": seconds(longest.group(2)),
        "p99_multi": seconds(ours[-1].split("|")[6]),
    }


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    sim, trace, nodes, compress = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    extra = sys.argv[5:]
    runs = [
        [sim, "--trace", trace, "--nodes", nodes, "--compress", f"{compress * f:.3f}", "--interval", str(i)] + extra
        for f in COMPRESSION_FACTORS
        for i in INTERVALS
    ]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        res = list(pool.map(one_run, runs))
    med = lambda k: hours(statistics.median(r[k] for r in res))  # noqa: E731
    no_worse = sum(1 for r in res if r["ours"] <= r["easy"])
    print(
        f"{os.path.basename(trace)} x{compress:g}, {nodes} nodes {' '.join(extra)}: "
        f"p99 wait of 1-GPU jobs, median of {len(res)} runs: ours {med('ours')}, EASY {med('easy')} "
        f"(ours no worse in {no_worse}); longest wait: ours {med('longest_ours')}, EASY {med('longest_easy')}; "
        f"our p99 of 2-8 GPU jobs {med('p99_multi')}"
    )


if __name__ == "__main__":
    main()
