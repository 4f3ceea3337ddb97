#!/usr/bin/env python3
"""SIGKILLs a Chidori client that holds GPU memory and measures how long until the GPU has it back.

    kill_release.py PID HELD_GIB [--timeout S]

Reads the GPU's used memory through NVML (libnvidia-ml.so.1, ctypes), sends SIGKILL to PID, then
polls every 20 ms until used memory has dropped by at least 90% of HELD_GIB. Prints one JSON
object: {"released_s": seconds} or {"released_s": null, ...} on timeout.
"""
import argparse
import ctypes
import json
import os
import signal
import time


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pid", type=int)
    parser.add_argument("held_gib", type=float)
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0, "nvmlInit failed"
    device = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) == 0
    memory = Memory()

    def used():
        assert nvml.nvmlDeviceGetMemoryInfo(device, ctypes.byref(memory)) == 0
        return memory.used

    before = used()
    os.kill(args.pid, signal.SIGKILL)
    start = time.monotonic()
    goal = before - 0.9 * args.held_gib * (1 << 30)
    while time.monotonic() - start < args.timeout:
        if used() <= goal:
            print(json.dumps({"released_s": round(time.monotonic() - start, 3),
                              "used_before_mib": before >> 20, "used_after_mib": memory.used >> 20}))
            return
        time.sleep(0.02)
    print(json.dumps({"released_s": None, "used_before_mib": before >> 20, "used_after_mib": used() >> 20}))


if __name__ == "__main__":
    main()
