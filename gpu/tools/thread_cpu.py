#!/usr/bin/env python3
"""Where the CPU goes while a command runs: CPU seconds per thread name, machine-wide.

    thread_cpu.py [--match NAME ...] [--every SECONDS] -- command [args...]

Runs the command and samples every thread of every process on the machine (Linux
``/proc/PID/task/TID/stat``) until it exits, keeping each thread's last user+system time
(threads that end mid-run count as of their last sample). Prints, after the command's own
output, one line per (process name, thread name) whose process name contains one of the
``--match`` strings (default: chidori, rtt, python): CPU seconds, and the share of the
command's wall time that is (100% = one core busy throughout). Thread names that end in
digits are counted together (``chidori-lane3-out`` as ``chidori-laneN-out``). Threads that
ran before the command started count only what they used after it did.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

TICK = os.sysconf("SC_CLK_TCK")

Key = tuple[int, int]


def sample() -> dict[Key, tuple[str, str, float]]:
    """Every thread now: (pid, tid) -> (process name, thread name, CPU seconds)."""
    out: dict[Key, tuple[str, str, float]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                proc = f.read().strip()
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # The thread name is in parentheses and may hold spaces; fields follow it.
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            out[(int(pid), int(tid))] = (proc, name, cpu)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--match", action="append", help="process names to report (substring)")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    matches = args.match or ["chidori", "rtt", "python"]

    before = sample()
    start = time.monotonic()
    child = subprocess.Popen(command)
    last: dict[Key, tuple[str, str, float]] = {}
    while child.poll() is None:
        last.update(sample())
        time.sleep(args.every)
    last.update(sample())
    wall = time.monotonic() - start

    totals: dict[tuple[str, str], float] = defaultdict(float)
    for key, (proc, name, cpu) in last.items():
        if not any(m in proc for m in matches):
            continue
        used = cpu - before[key][2] if key in before else cpu
        if used > 0:
            totals[(proc, re.sub(r"\d+", "N", name))] += used
    print(f"thread_cpu: {wall:.2f} s wall, exit {child.returncode}", file=sys.stderr)
    for (proc, name), cpu in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"thread_cpu: {proc:16} {name:24} {cpu:7.2f} s {100 * cpu / wall:6.0f}%", file=sys.stderr)
    print(f"thread_cpu: total {sum(totals.values()):.2f} s", file=sys.stderr)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
