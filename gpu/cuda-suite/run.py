#!/usr/bin/env python3
"""Runs each program of the CUDA suite natively and through Chidori, and compares their stdout.

    python3 run.py --build-dir DIR --chidori PATH --server HOST:PORT
                   [--wan-server HOST:PORT] [--json OUT.json] [--only NAME ...] [--timeout S]

A program matches when its remote run exits with the native exit code (0) and prints exactly the
native stdout. The table comes last; the exit code is 0 only if every program matches everywhere.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def as_text(output):
    """What a timed-out run had printed: bytes, str or None depending on the Python version."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def run_once(command, env, timeout):
    """Runs command; returns rc (None on timeout), stdout, stderr and wall-clock seconds."""
    start = time.monotonic()
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True,
                              errors="replace", timeout=timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = None, as_text(exc.stdout), as_text(exc.stderr)
    return {"rc": rc, "seconds": round(time.monotonic() - start, 3),
            "stdout": stdout, "stderr": stderr}


def summary(result):
    """The table cell: the first 40 characters of the last stdout line, or why there is none."""
    if result["rc"] is None:
        return "TIMEOUT"
    lines = result["stdout"].splitlines()
    if result["rc"] != 0:
        errors = result["stderr"].strip().splitlines()
        return f"rc={result['rc']} {errors[-1] if errors else ''}"[:40]
    return lines[-1][:40] if lines else "(no output)"


def matches(native, remote):
    return native["rc"] == 0 and remote["rc"] == 0 and remote["stdout"] == native["stdout"]


def first_difference(native, remote):
    """A one-line description of where the remote stdout departs from the native one."""
    a, b = native["stdout"].splitlines(), remote["stdout"].splitlines()
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i + 1}: native {x!r} remote {y!r}"
    if len(a) != len(b):
        return f"native has {len(a)} lines, remote {len(b)}"
    return f"native {exit_status(native)}, remote {exit_status(remote)}"


def exit_status(result):
    return "timeout" if result["rc"] is None else f"rc {result['rc']}"


def print_table(rows, headers):
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
    for row in [headers] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", required=True, type=Path)
    parser.add_argument("--chidori", required=True, type=Path, help="the chidori binary")
    parser.add_argument("--server", required=True, help="HOST:PORT of chidori serve")
    parser.add_argument("--wan-server", help="HOST:PORT of a chidori serve reached over a WAN")
    parser.add_argument("--json", type=Path, help="write every run's results here")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only NAME (repeatable)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per run (default 120)")
    args = parser.parse_args()

    build_dir = args.build_dir.resolve()
    chidori = str(args.chidori.resolve())
    programs = sorted(p.name for p in build_dir.iterdir() if p.is_file() and os.access(p, os.X_OK))
    missing: list[str] = []
    if args.only:
        # A program that failed to build is reported (and fails the run); the others still run.
        missing = sorted(set(args.only) - set(programs))
        if missing:
            print(f"not built in {build_dir}: {', '.join(missing)}", file=sys.stderr)
        programs = [p for p in programs if p in args.only]
    if not programs:
        sys.exit(f"no programs in {build_dir}; run build.sh first")

    targets = [("remote", args.server)] + ([("wan", args.wan_server)] if args.wan_server else [])
    results = []
    for name in programs:
        path = str(build_dir / name)
        entry = {"name": name, "native": run_once([path], os.environ.copy(), args.timeout)}
        for label, server in targets:
            env = dict(os.environ, CHIDORI_SERVER=server)
            entry[label] = run_once([chidori, "run", "-s", server, "--", path], env, args.timeout)
            entry[f"{label}_match"] = matches(entry["native"], entry[label])
            if not entry[f"{label}_match"]:
                print(f"{name} ({label}): {first_difference(entry['native'], entry[label])}")
                for line in entry[label]["stderr"].strip().splitlines()[-5:]:
                    print(f"    {line}")
        print(f"{name}: done", file=sys.stderr, flush=True)
        results.append(entry)

    headers = ["program", "native"]
    for label, _ in targets:
        headers += [label, "match" if label == "remote" else f"{label} match"]
    headers += ["native s"] + [f"{label} s" for label, _ in targets]
    rows = []
    for entry in results:
        row = [entry["name"], summary(entry["native"])]
        for label, _ in targets:
            row += [summary(entry[label]), "yes" if entry[f"{label}_match"] else "no"]
        row += [f"{entry[key]['seconds']:.2f}" for key in ["native"] + [l for l, _ in targets]]
        rows.append(row)
    all_match = all(entry[f"{label}_match"] for entry in results for label, _ in targets)

    if args.json:
        args.json.write_text(json.dumps({
            "servers": dict(targets), "all_match": all_match, "programs": results}, indent=2) + "\n")
    n_matching = sum(all(e[f"{label}_match"] for label, _ in targets) for e in results)
    print(f"\n{n_matching} of {len(results)} programs match\n")
    print_table(rows, headers)
    if missing:
        print(f"\nnot built (see the build log): {', '.join(missing)}")
    return 0 if all_match and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
