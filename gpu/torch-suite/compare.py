#!/usr/bin/env python3
"""Run run_cases.py natively and through Chidori, compare case by case, print a table last.

    python3 compare.py --chidori PATH --server HOST:PORT [--wan-server HOST:PORT]
                       [--json OUT] [--only a,b] [--timeout S] [--total S] [--rtt-ms MS]

With a WAN run, a second table sets each case's WAN time against what a program that waits
only at its own host synchronizations would take: native time + its synchronizing round
trips × RTT + 10 RTT (issue 19's bound), with the suite's totals.

Floats are compared relative to the larger of the two (inside a list: to the largest
magnitude in the list) with the case's tolerance: exact 0, fp32 1e-5, loose 1e-3; everything
else must be equal. A case matches when it succeeded in both runs and every value agrees.
"info" values are shown, never compared. Exits 0 only if every run exited 0 and every case
matches. Standard library only.
"""
import argparse
import json
import math
import os
import ast
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = {"exact": 0.0, "fp32": 1e-5, "loose": 1e-3}


def case_names():
    """The cases of cases.py in order, read without importing torch."""
    tree = ast.parse(open(os.path.join(HERE, "cases.py")).read())
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "case" for d in node.decorator_list)]


def run_once(prefix, names, timeout):
    cmd = prefix + [sys.executable, os.path.join(HERE, "run_cases.py"), "--only", ",".join(names)]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout, stderr, rc = e.stdout or b"", e.stderr or b"", f"timeout after {timeout}s"
    records = {}
    for line in stdout.decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "case" in record:
            records[record["case"]] = record
    return cmd, rc, records, stderr.decode(errors="replace").splitlines()[-30:]


def run(label, prefix, only, timeout, deadline=None):
    """Run the cases under prefix; records by case name, plus how the process ended. A case
    that kills its process (or runs past the timeout) is recorded as failed with the end of
    stderr, and the cases after it run in a new process, until `deadline` (a monotonic
    time): cases left then are recorded as not run."""
    pending = only.split(",") if only else case_names()
    print(f"== {label}: {' '.join(prefix)} run_cases.py ({len(pending)} cases)", file=sys.stderr, flush=True)
    records, rcs, tail, cmd = {}, [], [], []
    while pending:
        left = timeout if deadline is None else min(timeout, deadline - time.monotonic())
        if left <= 1:
            for name in pending:
                records[name] = {"case": name, "tol": "exact", "ok": False, "result": None, "info": {},
                                 "error": "not run: the suite's time budget (--total) was spent", "seconds": None}
            rcs.append("time budget spent")
            break
        cmd, rc, got, tail = run_once(prefix, pending, left)
        records.update(got)
        rcs.append(rc)
        missing = [n for n in pending if n not in got]
        if rc == 0 or not missing:
            break
        dead = missing[0]
        records[dead] = {"case": dead, "tol": "exact", "ok": False, "result": None, "info": {},
                         "error": f"the process ended ({rc}) in this case:\n" + "\n".join(tail[-12:]),
                         "seconds": None}
        pending = missing[1:]
    rc = next((r for r in rcs if r != 0), 0)
    return {"label": label, "cmd": cmd, "rc": rc, "records": records, "stderr_tail": tail}


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rel_diff(a, b, scale):
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), scale)


def short(v):
    text = json.dumps(v)
    return text if len(text) <= 100 else text[:97] + "..."


def diff(a, b, tol, path, bad, scale=0.0):
    """Largest relative difference between the floats of a and b; mismatches are added to bad."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return max((diff(a[k], b[k], tol, f"{path}.{k}", bad) for k in a), default=0.0)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        scale = max((abs(v) for v in a + b if isinstance(v, float) and math.isfinite(v)), default=0.0)
        return max((diff(x, y, tol, f"{path}[{i}]", bad, scale) for i, (x, y) in enumerate(zip(a, b))),
                   default=0.0)
    if is_number(a) and is_number(b) and (isinstance(a, float) or isinstance(b, float)):
        rel = rel_diff(float(a), float(b), scale)
        if rel > tol:
            bad.append(f"{path}: {a!r} vs {b!r} (relative {rel:.3g}, tolerance {tol:g})")
        return rel
    if type(a) is not type(b) or a != b:
        bad.append(f"{path}: {short(a)} vs {short(b)}")
    return 0.0


def compare(native, other):
    """(match, max relative diff or None, reasons) for one case."""
    if native is None or other is None:
        return False, None, ["no result"]
    if not (native["ok"] and other["ok"]):
        return False, None, ["case failed"]
    bad = []
    rel = diff(native["result"], other["result"], TOLERANCE[native["tol"]], "result", bad)
    if native["tol"] != other["tol"]:
        bad.append(f"tolerance {native['tol']} vs {other['tol']}")
    return not bad, rel, bad


def ok_cell(record):
    return "-" if record is None else "ok" if record["ok"] else "FAIL"


def table(rows):
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def bound_table(names, native, wan, rtt):
    """Each case's WAN time against native + synchronizing round trips × RTT + 10 RTT."""
    rows = [["case", "native s", "wan s", "round trips", "sync round trips", "bound s", "within"]]
    total_native = total_wan = 0.0
    within = counted = 0
    for name in names:
        n, w = native["records"].get(name) or {}, wan["records"].get(name) or {}
        ns, ws, syncs = n.get("seconds"), w.get("seconds"), w.get("sync_round_trips")
        if ns is None or ws is None:
            rows.append([name, ns or "-", ws or "-", w.get("round_trips", "-"), syncs if syncs is not None else "-", "-", "-"])
            continue
        total_native += ns
        total_wan += ws
        bound = ns + (syncs or 0) * rtt + 10 * rtt if syncs is not None else None
        ok = bound is not None and ws <= bound
        counted += bound is not None
        within += ok
        rows.append([name, f"{ns:.3f}", f"{ws:.3f}", w.get("round_trips", "-"), syncs if syncs is not None else "-",
                     "-" if bound is None else f"{bound:.3f}", "yes" if ok else "NO"])
    table(rows)
    ratio = f"{total_wan / total_native:.2f}" if total_native else "-"
    print(f"\n{within} of {counted} cases within the bound; suite total {total_wan:.1f} s at "
          f"{rtt * 1000:.0f} ms vs {total_native:.1f} s native ({ratio}x)")
    other_waits(names, wan)


def other_waits(names: list[str], wan: dict) -> None:
    """The round trips of each case that were not its own synchronizations, by function."""
    lines = []
    for name in names:
        waits = (wan["records"].get(name) or {}).get("other_waits") or {}
        if waits:
            lines.append(f"  {name}: " + ", ".join(f"{f} {n}" for f, n in waits.items()))
    if lines:
        print("\nround trips that were not the cases' own synchronizations:")
        print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chidori", required=True, help="path of the chidori binary")
    parser.add_argument("--server", required=True, help="HOST:PORT of chidori serve")
    parser.add_argument("--wan-server", help="HOST:PORT of a chidori serve reached over a WAN")
    parser.add_argument("--wan-only", action="store_true", help="compare only the WAN run with the native one")
    parser.add_argument("--json", help="write runs and comparisons to this file")
    parser.add_argument("--only", help="comma-separated case names (default: all)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for each whole run")
    parser.add_argument("--total", type=float, help="seconds for everything: later cases are not run")
    parser.add_argument("--rtt-ms", type=float, default=70.0, help="the WAN's round-trip time, for the bound table")
    args = parser.parse_args()

    targets = [] if args.wan_only and args.wan_server else [("remote", args.server)]
    targets += [("wan", args.wan_server)] if args.wan_server else []
    deadline = time.monotonic() + args.total if args.total else None
    native = run("native", [], args.only, args.timeout, deadline)
    others = [run(label, [args.chidori, "run", "-s", server, "--"], args.only, args.timeout, deadline)
              for label, server in targets]
    runs = [native] + others

    names = list(dict.fromkeys(name for r in runs for name in r["records"]))
    comparisons = []
    for name in names:
        entry = {"case": name}
        for other in others:
            match, rel, reasons = compare(native["records"].get(name), other["records"].get(name))
            entry[other["label"]] = {"match": match, "max_rel_diff": rel, "reasons": reasons}
        comparisons.append(entry)

    for r in runs:
        if r["rc"] != 0:
            print(f"\n{r['label']} run ended with {r['rc']}; stderr tail:")
            print("\n".join("  " + line for line in r["stderr_tail"]))
        for name, record in r["records"].items():
            if not record["ok"]:
                print(f"\n{r['label']} {name} failed: {record['error'].strip().splitlines()[-1]}")
    for entry in comparisons:
        for other in others:
            reasons = entry[other["label"]]["reasons"]
            if reasons and reasons != ["case failed"]:
                print(f"\n{entry['case']}: native vs {other['label']}")
                print("\n".join("  " + reason for reason in reasons[:12]))
                if len(reasons) > 12:
                    print(f"  ... {len(reasons) - 12} more")
    for name in names:
        records = [(r["label"], r["records"].get(name)) for r in runs]
        keys = list(dict.fromkeys(k for _, rec in records if rec for k in rec["info"]))
        for key in keys:
            values = ", ".join(f"{label}={short(rec['info'].get(key)) if rec else '-'}" for label, rec in records)
            print(f"info {name}.{key}: {values}")

    passed = bool(names) and all(r["rc"] == 0 for r in runs) and all(
        entry[other["label"]]["match"] for entry in comparisons for other in others)
    matching = sum(all(entry[other["label"]]["match"] for other in others) for entry in comparisons)
    print(f"\n{matching} of {len(names)} cases match" + ("" if passed else "; FAILED"))

    header = ["case", "tol", "native"]
    for other in others:
        header += [other["label"], f"{other['label']} match", f"{other['label']} max rel diff"]
    header += [f"{r['label']} s" for r in runs]
    rows = [header]
    for entry in comparisons:
        name = entry["case"]
        record = native["records"].get(name)
        row = [name, (record or {}).get("tol", "-"), ok_cell(record)]
        for other in others:
            cmp, rel = entry[other["label"]], entry[other["label"]]["max_rel_diff"]
            row += [ok_cell(other["records"].get(name)), "yes" if cmp["match"] else "NO",
                    "-" if rel is None else f"{rel:.2e}"]
        row += [(r["records"].get(name) or {}).get("seconds", "-") for r in runs]
        rows.append(row)
    print()
    table(rows)
    wan = next((r for r in others if r["label"] == "wan"), None)
    if wan:
        print()
        bound_table(names, native, wan, args.rtt_ms / 1000.0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "comparisons": comparisons, "passed": passed}, f, indent=1)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
