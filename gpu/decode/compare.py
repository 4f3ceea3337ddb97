#!/usr/bin/env python3
"""Compare generate_cases.py runs with the native one and print a table.

    python3 compare.py NATIVE.jsonl LABEL=RUN.jsonl ... [--graph LABEL=tok_per_s ...]

Greedy cases must give the native tokens exactly; the sampling case is compared by its
statistics (distinct tokens, entropy), which must be close. Each row shows the run's
time, time to first token, tokens per second (over the whole generate) and its ratio to
native, the decode rate (tokens after the first, per second after the first arrived, where
a streamer listened) and, where a reference is given with --graph (native CUDA-graph replay
tok/s of the same model), both rates' ratios to it. Exit 0 only if every case matches.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def load(path: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict) and "case" in r:
                    out[r["case"]] = r
    except OSError:
        pass
    return out


def verdict(native: dict[str, Any], run: dict[str, Any]) -> str:
    if not run.get("ok"):
        return "FAILED " + str(run.get("error", "missing"))[:120]
    if not native.get("ok"):
        return "native failed"
    if "entropy_bits" in native:
        close = abs(run["entropy_bits"] - native["entropy_bits"]) <= 0.1 * native["entropy_bits"] + 0.2
        return "same distribution" if close else f"DISTRIBUTION DIFFERS ({run['entropy_bits']} vs {native['entropy_bits']} bits)"
    if run["tokens"] == native["tokens"]:
        return "identical tokens"
    return "TOKENS DIFFER"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("native")
    p.add_argument("runs", nargs="+", help="LABEL=PATH")
    p.add_argument("--graph", action="append", default=[], help="CASE=TOK_PER_S of native graph replay")
    a = p.parse_args()
    native = load(a.native)
    graph = {k: float(v) for k, v in (g.split("=", 1) for g in a.graph)}
    runs = [(lbl, load(path)) for lbl, path in (r.split("=", 1) for r in a.runs)]
    bad = 0
    print(f"{'case':28} {'run':10} {'seconds':>8} {'ttft':>7} {'tok/s':>8} {'x native':>9} {'x graph':>8} "
          f"{'decode':>8} {'x graph':>8}  result")
    for name, n in native.items():
        print(f"{name:28} {'native':10} {n.get('seconds', '-'):>8} {str(n.get('ttft', '-')):>7} "
              f"{n.get('tok_per_s', '-'):>8} {'':>9} {'':>8} {str(n.get('decode_tok_per_s') or '-'):>8} {'':>8}  "
              f"{'ok' if n.get('ok') else n.get('error', '')[:80]}")
        for label, rows in runs:
            r = rows.get(name, {"ok": False, "error": "missing"})
            v = verdict(n, r)
            bad += v.startswith(("FAILED", "TOKENS", "DISTRIBUTION"))
            ratio = f"{r['tok_per_s'] / n['tok_per_s']:.3f}" if r.get("ok") and n.get("ok") else "-"
            g = graph.get(name)
            gr = f"{r['tok_per_s'] / g:.3f}" if g and r.get("ok") else "-"
            decode = r.get("decode_tok_per_s") if r.get("ok") else None
            dr = f"{decode / g:.3f}" if g and decode else "-"
            print(f"{'':28} {label:10} {r.get('seconds', '-'):>8} {str(r.get('ttft', '-')):>7} "
                  f"{r.get('tok_per_s', '-'):>8} {ratio:>9} {gr:>8} {str(decode or '-'):>8} {dr:>8}  {v}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
