#!/usr/bin/env python3
"""Runs the standard workloads natively and through `chidori run`, in one process per run,
and prints remote/native ratios with the correctness values side by side.

    python3 gpu/workloads.py --chidori PATH --server HOST:PORT [--wan-server HOST:PORT]
                             --workloads DIR [--json OUT] [--quick] [--only NAME ...]
                             [--before-chidori PATH --before-server HOST:PORT
                              [--before-wan-server HOST:PORT]]

With --before-chidori (a build of an earlier commit, with its own server), each remote run
is made again through it: a change's before and after, values and round trips, in one call.

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

# name, script, arguments, units of work (for round trips per unit)
CONFIGS = [
    ("matmul-fp16", "matmul.py", ["--dtype", "fp16"], None),
    ("matmul-fp32", "matmul.py", ["--dtype", "fp32"], None),
    ("train-fp32", "train.py", ["--dtype", "fp32"], "steps"),
    ("train-fp16", "train.py", ["--dtype", "fp16"], "steps"),
    ("decode-static", "decode.py", ["--mode", "generate", "--cache", "static"], "new_tokens"),
    ("decode-dynamic", "decode.py", ["--mode", "generate", "--cache", "dynamic"], "new_tokens"),
    ("decode-graph", "decode.py", ["--mode", "graph"], "new_tokens"),
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


def calls_round_trips(run_result):
    """Round trips of the trace without module loads, if the run has a trace."""
    total = run_result.get("round_trips")
    if total is None:
        return None
    for line in run_result.get("trace", "").splitlines():
        m = re.match(r"\(module load\)\s+(\d+)\s+(\d+)", line.strip())
        if m:
            return total - int(m.group(2))
    return total


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


def agrees(native, remote):
    """Whether a remote run reproduced the native correctness value: the same tokens, the
    same losses to 1e-3 relative, a matmul check of the same magnitude."""
    if not native or not remote:
        return False
    if "tokens" in native:
        return native["tokens"] == remote.get("tokens")
    if "loss" in native:
        pairs = [(native["loss"], remote.get("loss"))] + list(zip(native.get("losses", []), remote.get("losses", [])))
        return all(b is not None and abs(a - b) <= 1e-3 * max(abs(a), 1e-6) for a, b in pairs)
    if "check" in native:
        a, b = native["check"], remote.get("check")
        return b is not None and b <= 10 * max(a, 1e-12)
    return False


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
    ap.add_argument("--wan-only", action="store_true", help="only the 70 ms runs (and their native twins)")
    ap.add_argument("--before-chidori", help="chidori of an earlier commit: every remote run again through it")
    ap.add_argument("--before-server", help="HOST:PORT of the earlier commit's server")
    ap.add_argument("--before-wan-server", help="HOST:PORT of a 70 ms relay to the earlier commit's server")
    a = ap.parse_args()
    if a.before_chidori and not a.before_server:
        ap.error("--before-chidori needs --before-server")
    rows = []
    for name, script, args, unit in CONFIGS:
        if a.only and name not in a.only:
            continue
        path = os.path.join(a.workloads, script)
        extra = QUICK.get(script, []) if a.quick else []
        base = [sys.executable, path] + args + extra
        entry = {"name": name, "args": args + extra}
        skipped = {"rc": "skipped", "result": None, "stderr_tail": "", "trace": "", "round_trips": None}
        entry["native"] = skipped if a.wan_only else run(base, a.timeout)
        entry["remote"] = skipped if a.wan_only else run([a.chidori, "run", "--trace", "-s", a.server, "--"] + base, a.timeout)
        if a.wan_server and not a.no_wan:
            wargs = args + (extra or WAN_ARGS.get(script, []))
            wbase = [sys.executable, path] + wargs
            entry["wan_args"] = wargs
            entry["wan_native"] = run(wbase, a.timeout)
            entry["wan"] = run([a.chidori, "run", "--trace", "-s", a.wan_server, "--"] + wbase, a.timeout)
            if a.before_chidori and a.before_wan_server:
                entry["before_wan"] = run([a.before_chidori, "run", "--trace", "-s", a.before_wan_server, "--"] + wbase, a.timeout)
        if a.before_chidori and not a.wan_only:
            entry["before"] = run([a.before_chidori, "run", "--trace", "-s", a.before_server, "--"] + base, a.timeout)
        if unit == "new_tokens" and not a.wan_only:
            # Round trips per token once generation runs: the difference to a run with half
            # the tokens (setup, weights and graph building cancel out).
            full = (entry["remote"].get("result") or {}).get("new_tokens")
            if full:
                half = full // 2
                # argparse takes the last --new-tokens given.
                entry["remote_half"] = run([a.chidori, "run", "--trace", "-s", a.server, "--"] + base + ["--new-tokens", str(half)], a.timeout)
                # Module loads differ only by the server's module cache (the later run finds
                # the modules the earlier one uploaded): left out.
                rt_full, rt_half = calls_round_trips(entry["remote"]), calls_round_trips(entry["remote_half"])
                if rt_full is not None and rt_half is not None:
                    entry["steady_round_trips_per_token"] = round((rt_full - rt_half) / (full - half), 2)
        if unit:
            for k in ("remote", "wan", "before", "before_wan"):
                r = entry.get(k)
                units = (r or {}).get("result", {}) or {}
                n = units.get(unit) if isinstance(units, dict) else None
                if r and r.get("round_trips") is not None and n:
                    r["round_trips_per_unit"] = round(r["round_trips"] / n, 2)
        rows.append(entry)
        if a.json:
            # After every workload: a round stopped by its timeout keeps what it measured.
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        print(json.dumps({"done": name, "native": entry["native"]["result"], "remote": entry["remote"]["result"],
                          "remote_rc": entry["remote"]["rc"], "wan_native": entry.get("wan_native", {}).get("result"),
                          "wan": entry.get("wan", {}).get("result"), "wan_rc": entry.get("wan", {}).get("rc"),
                          "wan_round_trips": entry.get("wan", {}).get("round_trips")}), flush=True)
        for k in ("remote", "wan", "before", "before_wan"):
            if k in entry and entry[k]["rc"] not in (0, "skipped"):
                print(f"{k}: " + entry[k]["stderr_tail"][-2500:], flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print()
    print(f"{'workload':16} {'native':>10} {'remote':>10} {'ratio':>6} {'rt/unit':>8} {'steady':>6}  {'wan nat':>9} {'wan':>9} {'wan/nat':>7} {'rt/unit':>8}  same result (loopback, wan); check native | remote")
    for e in rows:
        n, r = metric(e["native"]["result"]), metric(e["remote"]["result"])
        ratio = f"{r / n:.3f}" if n and r else "-"
        w = e.get("wan")
        wn = metric(e.get("wan_native", {}).get("result")) if w else None
        wm = metric(w["result"]) if w else None
        wr = f"{wm / wn:.3f}" if wn and wm else "-"
        cn, cr = check_value(e["native"]["result"]), check_value(e["remote"]["result"])
        short = lambda v: json.dumps(v)[:40] if v is not None else "FAILED"
        same = lambda x, y: "-" if x is None else ("yes" if agrees(x.get("result"), (y or {}).get("result")) else "NO")
        loop_ok = "-" if e["native"]["rc"] == "skipped" else same(e["native"], e["remote"])
        wan_ok = same(e.get("wan_native"), w) if w else "-"
        print(f"{e['name']:16} {n or '-':>10} {r or '-':>10} {ratio:>6} {e['remote'].get('round_trips_per_unit', '-'):>8} "
              f"{e.get('steady_round_trips_per_token', '-'):>6}  {wn or '-':>9} {wm or '-':>9} {wr:>7} {(w or {}).get('round_trips_per_unit', '-'):>8}  {loop_ok}, {wan_ok}; "
              f"{short(cn)} | {short(cr)}")
    if a.before_chidori:
        before_table(rows)


def before_table(rows):
    """Each workload through the earlier commit and this one: the values against native, the
    round trips and the metric (loopback, then 70 ms)."""
    print()
    print(f"{'workload':16} {'where':6} {'native':>10} {'before':>10} {'after':>10} {'rt before':>9} {'rt after':>9}  same values as native (before, after)")
    for e in rows:
        for where, nat, bef, aft in (("loop", "native", "before", "remote"), ("70ms", "wan_native", "before_wan", "wan")):
            if bef not in e:
                continue
            n, b, r = (e.get(k) or {} for k in (nat, bef, aft))
            ok = lambda x: "yes" if agrees(n.get("result"), x.get("result")) else "NO"
            fmt = lambda v: v if v is not None else "-"
            print(f"{e['name']:16} {where:6} {fmt(metric(n.get('result'))):>10} {fmt(metric(b.get('result'))):>10} "
                  f"{fmt(metric(r.get('result'))):>10} {fmt(b.get('round_trips')):>9} {fmt(r.get('round_trips')):>9}  {ok(b)}, {ok(r)}")


if __name__ == "__main__":
    main()
