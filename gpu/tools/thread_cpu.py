#!/usr/bin/env python3
"""Where the CPU goes while a command runs: CPU seconds per thread name, machine-wide.

    thread_cpu.py [--match NAME ...] [--every SECONDS] -- command [args...]

Runs the command and samples every thread of the machine's processes whose names contain
one of the ``--match`` strings (default: chidori, rtt, python; this script's own process
left out) from Linux ``/proc/PID/task/TID/stat`` until it exits, keeping each thread's last
user+system time (threads that end mid-run count as of their last sample). Prints, after the
command's own output, one line per (process name, thread name): CPU seconds, and the share
of the command's wall time that is (100% = one core busy throughout). Digits in thread names
count as one name (``chidori-lane3-out`` as ``chidori-laneN-out``). Threads that
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


def sample(matches: list[str]) -> dict[Key, tuple[str, str, float]]:
    """Every thread now of the processes whose names contain one of `matches` (this one's
    own left out): (pid, tid) -> (process name, thread name, CPU seconds)."""
    out: dict[Key, tuple[str, str, float]] = {}
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                proc = f.read().strip()
            if not any(m in proc for m in matches):
                continue
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

    before = sample(matches)
    start = time.monotonic()
    child = subprocess.Popen(command)
    last: dict[Key, tuple[str, str, float]] = {}
    while child.poll() is None:
        last.update(sample(matches))
        time.sleep(args.every)
    last.update(sample(matches))
    wall = time.monotonic() - start

    totals: dict[tuple[str, str], float] = defaultdict(float)
    for key, (proc, name, cpu) in last.items():
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
