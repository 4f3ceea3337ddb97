#!/usr/bin/env python3
"""Run the cases of cases.py in this process and print one JSON line per case:

    {"case", "tol", "ok", "result", "info", "error", "seconds"}

    python3 run_cases.py [--only a,b]

A failing case is recorded (error holds its traceback) and the next one runs.
"""
import argparse
import json
import sys
import time
import traceback

import torch

from cases import CASES


def run_case(name, fn):
    start = time.perf_counter()
    try:
        result = fn()
        torch.cuda.synchronize()
        info = result.pop("info", {})
        json.dumps([result, info])  # fail here, as this case, if a value is not JSON
        ok, error = True, None
    except Exception:
        result, info, ok, error = None, {}, False, traceback.format_exc()
    return {"case": name, "tol": fn.tol, "ok": ok, "result": result, "info": info, "error": error,
            "seconds": round(time.perf_counter() - start, 3)}


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
