#!/usr/bin/env python3
"""Runs the standard workloads natively and through `chidori run`, in one process per run,
and prints remote/native ratios with the correctness values side by side.

    python3 gpu/workloads.py --chidori PATH --server HOST:PORT [--wan-server HOST:PORT]
                             --workloads DIR [--json OUT] [--quick] [--only NAME ...]

Each remote run has `--trace`: the round trips it made are reported (per training step and
per generated token where the workload says how many). Standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

# name, script, arguments, units of work (for round trips per unit), whether to run at 70 ms
CONFIGS = [
    ("matmul-fp16", "matmul.py", ["--dtype", "fp16"], None, False),
    ("matmul-fp32", "matmul.py", ["--dtype", "fp32"], None, False),
    ("train-fp32", "train.py", ["--dtype", "fp32"], "steps", True),
    ("train-fp16", "train.py", ["--dtype", "fp16"], "steps", False),
    ("decode-static", "decode.py", ["--mode", "generate", "--cache", "static"], "new_tokens", True),
    ("decode-dynamic", "decode.py", ["--mode", "generate", "--cache", "dynamic"], "new_tokens", False),
    ("decode-graph", "decode.py", ["--mode", "graph"], "new_tokens", False),
]
# Smaller runs for a first check that everything works.
QUICK = {
    "matmul.py": ["--n", "2048", "--iters", "20"],
    "train.py": ["--steps", "10", "--log-every", "5"],
    "decode.py": ["--layers", "4", "--new-tokens", "24"],
}
# At 70 ms each round trip costs real time: fewer steps and tokens, a smaller decode model
# (both sides of the WAN comparison run these same arguments).
WAN_ARGS = {"train.py": ["--steps", "12", "--log-every", "6"], "decode.py": ["--layers", "4", "--new-tokens", "8"]}


def run(cmd, timeout, env=None):
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    result = None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except ValueError:
                pass
    # What the program printed before the trace table (a traceback, warnings), and the table.
    before, _, table = err.partition("chidori trace:")
    return {"rc": rc, "wall_s": round(time.monotonic() - start, 2), "result": result,
            "stderr_tail": before[-4000:], "trace": table[-6000:], "round_trips": round_trips(err)}


def round_trips(stderr):
    """Total round trips from the `chidori trace` table (its `total` row), if present."""
    for line in stderr.splitlines():
        m = re.match(r"\s*TOTAL\s+(\d+)\s+(\d+)", line)
        if m:
            return int(m.group(2))
    return None


def metric(result):
    if not result:
        return None
    for key in ("tflops", "tok_per_s"):
        if key in result:
            return result[key]
    return None


def check_value(result):
    if not result:
        return None
    for key in ("check", "loss", "tokens"):
        if key in result:
            return result[key]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chidori", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--wan-server")
    ap.add_argument("--workloads", required=True)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", action="append")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--no-wan", action="store_true", help="skip the 70 ms runs")
    a = ap.parse_args()
    rows = []
    for name, script, args, unit, wan in CONFIGS:
        if a.only and name not in a.only:
            continue
        path = os.path.join(a.workloads, script)
        extra = QUICK.get(script, []) if a.quick else []
        base = [sys.executable, path] + args + extra
        entry = {"name": name, "args": args + extra}
        entry["native"] = run(base, a.timeout)
        entry["remote"] = run([a.chidori, "run", "--trace", "-s", a.server, "--"] + base, a.timeout)
        if wan and a.wan_server and not a.no_wan:
            wargs = args + (extra or WAN_ARGS.get(script, []))
            wbase = [sys.executable, path] + wargs
            entry["wan_args"] = wargs
            entry["wan_native"] = run(wbase, a.timeout)
            entry["wan"] = run([a.chidori, "run", "--trace", "-s", a.wan_server, "--"] + wbase, a.timeout)
        if unit:
            for k in ("remote", "wan"):
                r = entry.get(k)
                units = (r or {}).get("result", {}) or {}
                n = units.get(unit) if isinstance(units, dict) else None
                if r and r.get("round_trips") is not None and n:
                    r["round_trips_per_unit"] = round(r["round_trips"] / n, 2)
        rows.append(entry)
        print(json.dumps({"done": name, "native": entry["native"]["result"], "remote": entry["remote"]["result"],
                          "remote_rc": entry["remote"]["rc"]}), flush=True)
        if entry["remote"]["rc"] != 0:
            print(entry["remote"]["stderr_tail"][-2500:], flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print()
    print(f"{'workload':16} {'native':>10} {'remote':>10} {'ratio':>6} {'rt/unit':>8}  {'wan':>10} {'wan/nat':>7} {'rt/unit':>8}  check native | remote")
    for e in rows:
        n, r = metric(e["native"]["result"]), metric(e["remote"]["result"])
        ratio = f"{r / n:.3f}" if n and r else "-"
        w = e.get("wan")
        wn = metric(e.get("wan_native", {}).get("result")) if w else None
        wm = metric(w["result"]) if w else None
        wr = f"{wm / wn:.3f}" if wn and wm else "-"
        cn, cr = check_value(e["native"]["result"]), check_value(e["remote"]["result"])
        short = lambda v: json.dumps(v)[:40] if v is not None else "FAILED"
        print(f"{e['name']:16} {n or '-':>10} {r or '-':>10} {ratio:>6} {e['remote'].get('round_trips_per_unit', '-'):>8}  "
              f"{wm or '-':>10} {wr:>7} {(w or {}).get('round_trips_per_unit', '-'):>8}  {short(cn)} | {short(cr)}")


if __name__ == "__main__":
    main()
