#!/usr/bin/env python3
"""Run the cases of cases.py in this process and print one JSON line per case:

    {"case", "tol", "ok", "result", "info", "error", "seconds"}

    python3 run_cases.py [--only a,b]

A failing case is recorded (error holds its traceback) and the next one runs. Under
`chidori run` each record also has the case's "round_trips" and, of those, "sync_round_trips":
the ones made by calls that block the host natively too (synchronizations, queries, copies),
which no remote run can avoid; "other_waits" names the functions (or Chidori's own rows, such
as "(module load)") that made the rest, with their round trips.
"""
import argparse
import json
import os
import sys
import time
import traceback

import torch

from cases import CASES

# The repository's Python package, for chidori.stats() (it imports without torch or a GPU).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
try:
    import chidori
except ImportError:
    chidori = None

# Functions whose round trips the program's own host synchronizations make.
SYNCS = ("Synchronize", "Query", "Memcpy", "MemcpyDtoH")


def remote_counts() -> tuple[int, int, dict[str, int]] | None:
    """(round trips, of them at synchronizing functions, the others by function) so far;
    None when not remote."""
    if chidori is None or not chidori.is_remote():
        return None
    stats = chidori.stats()
    total = stats.get("total", {}).get("round_trips", 0)
    rows = {name: row.get("round_trips", 0) for name, row in stats.items() if name != "total"}
    syncs = sum(n for name, n in rows.items() if any(s in name for s in SYNCS))
    others = {name: n for name, n in rows.items() if n and not any(s in name for s in SYNCS)}
    return total, syncs, others


def run_case(name, fn):
    before = remote_counts()
    start = time.perf_counter()
    try:
        result = fn()
        torch.cuda.synchronize()
        info = result.pop("info", {})
        json.dumps([result, info])  # fail here, as this case, if a value is not JSON
        ok, error = True, None
    except Exception:
        result, info, ok, error = None, {}, False, traceback.format_exc()
    record = {"case": name, "tol": fn.tol, "ok": ok, "result": result, "info": info, "error": error,
              "seconds": round(time.perf_counter() - start, 3)}
    after = remote_counts()
    if before is not None and after is not None:
        record["round_trips"] = after[0] - before[0]
        record["sync_round_trips"] = after[1] - before[1]
        waits = {name: n - before[2].get(name, 0) for name, n in after[2].items()}
        record["other_waits"] = {name: n for name, n in sorted(waits.items(), key=lambda kv: -kv[1]) if n > 0}
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated case names (default: all)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"unknown cases: {', '.join(unknown)}; known: {', '.join(CASES)}")
    for name in names:
        print(json.dumps(run_case(name, CASES[name])), flush=True)


if __name__ == "__main__":
    main()
