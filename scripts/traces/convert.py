#!/usr/bin/env python3
"""Convert public GPU-cluster traces to the trainyard-sim trace CSV.

Output columns: submit_time_s,duration_s,replicas,gpus_per_replica,project
(see crates/sim/TRACES.md for every choice made here and why).

    convert.py openb  openb_pod_list_default.csv      > openb.csv
    convert.py dlrm   disaggregated_DLRM_trace.csv    > dlrm.csv

Rows that cannot become a GPU job are dropped and counted on stderr, by reason.
"""
import collections
import csv
import math
import sys

GPUS_PER_NODE = 8


def num(s):
    """A finite float, or None for an empty, NaN or malformed field."""
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def gpu_count(value, dropped, no_gpu):
    """Whole GPUs of one replica (a fraction takes a whole one), or None, counted in
    `dropped` under `no_gpu` or as more than a node has."""
    gpus = num(value)
    if gpus is None or gpus <= 0:
        dropped[no_gpu] += 1
        return None
    gpus = int(math.ceil(gpus))
    if gpus > GPUS_PER_NODE:
        dropped["more GPUs than a node"] += 1
        return None
    return gpus


def openb(rows, dropped):
    """cluster-trace-gpu-v2023 openb_pod_list_*.csv: one pod is one job of one replica."""
    out = []
    for r in rows:
        # A GPU-sharing pod (num_gpu 1, gpu_milli < 1000) takes a whole GPU here: the
        # scheduler allocates whole accelerators.
        gpus = gpu_count(r.get("num_gpu"), dropped, "no GPU (CPU-only pod)")
        if gpus is None:
            continue
        created, sched, deleted = num(r.get("creation_time")), num(r.get("scheduled_time")), num(r.get("deletion_time"))
        if created is None or deleted is None:
            dropped["no creation or deletion time"] += 1
            continue
        if sched is None:
            # Never scheduled in the trace (Pending): its run time is unknown.
            dropped["never scheduled (no scheduled_time)"] += 1
            continue
        run = deleted - sched
        if run <= 0 or sched < created:
            dropped["run time <= 0 or scheduled before created"] += 1
            continue
        out.append((created, run, 1, gpus, r.get("qos") or "unknown"))
    return out


def dlrm(rows, dropped):
    """cluster-trace-gpu-v2025 disaggregated_DLRM_trace.csv: one instance is one job of one
    replica, its app its project. Times missing at the trace's edges are clipped to them."""
    times = [num(r.get(k)) for r in rows for k in ("creation_time", "scheduled_time", "deletion_time")]
    times = [t for t in times if t is not None]
    if not times:
        return []
    end = max(times)
    out = []
    for r in rows:
        gpus = gpu_count(r.get("gpu_request"), dropped, "no GPU (CPU node instance)")
        if gpus is None:
            continue
        created, sched, deleted = num(r.get("creation_time")), num(r.get("scheduled_time")), num(r.get("deletion_time"))
        # Existed before the trace began: submitted at its start (time 0).
        created = 0.0 if created is None else created
        sched = created if sched is None else sched
        # Still running when the trace ended: runs to its end (censored).
        deleted = end if deleted is None else deleted
        run = deleted - sched
        if run <= 0 or sched < created:
            dropped["run time <= 0 or scheduled before created"] += 1
            continue
        out.append((created, run, 1, gpus, r.get("app_name") or "unknown"))
    return out


def main(argv):
    if len(argv) != 3 or argv[1] not in ("openb", "dlrm"):
        sys.stderr.write(__doc__)
        return 2
    with open(argv[2], newline="") as f:
        rows = list(csv.DictReader(f))
    dropped = collections.Counter()
    jobs = (openb if argv[1] == "openb" else dlrm)(rows, dropped)
    jobs.sort(key=lambda j: j[0])
    # Times relative to the first submission, whole seconds (the trace's resolution).
    t0 = jobs[0][0] if jobs else 0.0
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["submit_time_s", "duration_s", "replicas", "gpus_per_replica", "project"])
    for s, d, k, g, p in jobs:
        w.writerow([int(round(s - t0)), int(round(max(d, 1.0))), k, g, p])
    sys.stderr.write(f"{argv[2]}: {len(rows)} rows, {len(jobs)} jobs written\n")
    for why, n in sorted(dropped.items()):
        sys.stderr.write(f"  dropped {n}: {why}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
