#!/usr/bin/env python3
"""NVML as pynvml (nvidia-ml-py) and nvidia-smi use it: driver and NVML versions, then per
GPU its name, UUID, PCI bus id, total memory and BAR1 size, and that utilization and used
memory read; then the facts of nvidia-smi's screens that stay put on an idle GPU (thresholds,
power limits, maximum clocks, modes, infoROM and firmware versions, CPU affinity) and that
the readings which move (temperatures, ECC and encoder counters, PCIe throughput) answer;
then the lists whose length the caller passes by pointer (supported clocks and P-states,
encoder and frame-capture sessions, samples) and, with a CUDA context of its own (torch),
that the GPU's process list shows this process, under its PID and name, using memory.

Prints only values that do not change from run to run: what moves is printed as its type,
a refusal as its NVML status (a GPU without ECC refuses the same way natively and remotely).
Run natively and through `chidori run`, the two outputs must be equal.
"""

import ctypes
import os
from pathlib import Path
from typing import Any, Callable

import pynvml


def text(value: "str | bytes") -> str:
    """pynvml returns str or bytes depending on its version."""
    return value.decode() if isinstance(value, bytes) else value


def ask(call: Callable[[], Any]) -> Any:
    """The call's value, or `error N` with the NVML status it raised."""
    try:
        return call()
    except pynvml.NVMLError as error:
        return f"error {error.value}"


def kind(call: Callable[[], Any]) -> str:
    """For readings that move: the type of the value, or `error N`."""
    value = ask(call)
    return value if isinstance(value, str) and value.startswith("error ") else type(value).__name__


def newer(name: str) -> "Callable[..., Any] | None":
    """A function only newer pynvml releases have (None: this one lacks it)."""
    return getattr(pynvml, name, None)


def gsp_firmware(handle: Any) -> str:
    """The GSP firmware version into a buffer of NVML_GSP_FIRMWARE_VERSION_BUF_SIZE bytes
    (older pynvml releases take the buffer as an argument)."""
    buffer = ctypes.create_string_buffer(64)
    pynvml.nvmlDeviceGetGspFirmwareVersion(handle, buffer)
    return text(buffer.value)


def fixed_facts(handle: Any) -> None:
    """What nvidia-smi -q shows that an idle GPU keeps from run to run."""
    thresholds = [ask(lambda t=t: pynvml.nvmlDeviceGetTemperatureThreshold(handle, t))
                  for t in (pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)]
    print("  thresholds", thresholds)
    print("  power limit", ask(lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle)),
          "default", ask(lambda: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)),
          "range", ask(lambda: pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)),
          "enforced", ask(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)))
    clocks = [ask(lambda c=c: pynvml.nvmlDeviceGetMaxClockInfo(handle, c))
              for c in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM)]
    print("  max clocks", clocks)
    print("  ecc mode", ask(lambda: pynvml.nvmlDeviceGetEccMode(handle)),
          "compute mode", ask(lambda: pynvml.nvmlDeviceGetComputeMode(handle)),
          "persistence", ask(lambda: pynvml.nvmlDeviceGetPersistenceMode(handle)))
    inforom = [ask(lambda o=o: text(pynvml.nvmlDeviceGetInforomVersion(handle, o)))
               for o in (pynvml.NVML_INFOROM_OEM, pynvml.NVML_INFOROM_ECC, pynvml.NVML_INFOROM_POWER)]
    print("  inforom", inforom, "gsp firmware", ask(lambda: gsp_firmware(handle)))
    # 16 words of 64 CPUs, 4 of 64 NUMA nodes: enough for any machine this runs on.
    print("  cpu affinity", ask(lambda: list(pynvml.nvmlDeviceGetCpuAffinity(handle, 16))),
          "memory affinity",
          ask(lambda: list(pynvml.nvmlDeviceGetMemoryAffinity(handle, 4, pynvml.NVML_AFFINITY_SCOPE_NODE))))
    print("  bridge chips", ask(lambda: pynvml.nvmlDeviceGetBridgeChipInfo(handle).bridgeCount))
    addressing = newer("nvmlDeviceGetAddressingMode")
    gpm = newer("nvmlGpmQueryDeviceSupport")
    print("  addressing mode", ask(lambda: addressing(handle)) if addressing else "absent",
          "gpm", ask(lambda: gpm(handle).isSupportedDevice) if gpm else "absent")


def readings(handle: Any) -> None:
    """Readings that move: only that they answer, and with what type."""
    print("  temperature", kind(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
          "power", kind(lambda: pynvml.nvmlDeviceGetPowerUsage(handle)),
          "pstate", kind(lambda: pynvml.nvmlDeviceGetPerformanceState(handle)))
    temperature_v = newer("nvmlDeviceGetTemperatureV")
    margin = newer("nvmlDeviceGetMarginTemperature")
    gpu = pynvml.NVML_TEMPERATURE_GPU
    print("  temperature v", kind(lambda: temperature_v(handle, gpu)) if temperature_v else "absent",
          "margin", kind(lambda: margin(handle)) if margin else "absent")
    print("  ecc errors", kind(lambda: pynvml.nvmlDeviceGetTotalEccErrors(
        handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)))
    print("  encoder stats", kind(lambda: pynvml.nvmlDeviceGetEncoderStats(handle)),
          "pcie tx", kind(lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)),
          "violation",
          kind(lambda: pynvml.nvmlDeviceGetViolationStatus(handle, pynvml.NVML_PERF_POLICY_POWER).violationTime))


def lists(handle: Any) -> None:
    """Arrays the caller sizes by pointer: the fixed ones printed, the moving ones typed."""
    memory_clocks = ask(lambda: pynvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    print("  memory clocks", memory_clocks)
    if isinstance(memory_clocks, list) and memory_clocks:
        graphics = ask(lambda: pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, memory_clocks[0]))
        print("  graphics clocks", graphics if isinstance(graphics, str) else len(graphics))
    print("  pstates", ask(lambda: pynvml.nvmlDeviceGetSupportedPerformanceStates(handle)))
    print("  encoder sessions", ask(lambda: len(pynvml.nvmlDeviceGetEncoderSessions(handle))),
          "fbc sessions", ask(lambda: len(pynvml.nvmlDeviceGetFBCSessions(handle))),
          "retired pages", ask(lambda: len(pynvml.nvmlDeviceGetRetiredPages(
              handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))))
    print("  samples", kind(lambda: pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)))


def own_process(handle: Any) -> None:
    """With a CUDA context of this process: the process list shows it (its PID, name and
    some memory), and torch's summary, which reads the same list, counts one process."""
    try:
        import torch
    except ImportError:
        print("  processes: no torch")
        return
    torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    mine = [p for p in listed if p.pid == os.getpid()]
    print("  processes: mine", len(mine), "using memory", bool(mine) and (mine[0].usedGpuMemory or 0) > 0)
    if mine:
        name = text(pynvml.nvmlSystemGetProcessName(mine[0].pid))
        started_as = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
        print("  process name", os.path.basename(name) == os.path.basename(started_as))
    print("  torch lists", torch.cuda.list_gpu_processes(0).count("process"), "process")


def main() -> None:
    pynvml.nvmlInit()
    print("driver", text(pynvml.nvmlSystemGetDriverVersion()), "nvml", text(pynvml.nvmlSystemGetNVMLVersion()))
    count = pynvml.nvmlDeviceGetCount()
    print("devices", count)
    for i in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        bar1 = pynvml.nvmlDeviceGetBAR1MemoryInfo(handle)
        pci = pynvml.nvmlDeviceGetPciInfo(handle)
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        assert 0 <= rates.gpu <= 100 and 0 <= rates.memory <= 100, (rates.gpu, rates.memory)
        assert 0 <= memory.used <= memory.total
        print(i, text(pynvml.nvmlDeviceGetName(handle)), text(pynvml.nvmlDeviceGetUUID(handle)),
              text(pci.busId), "memory", memory.total, "bar1", bar1.bar1Total)
        fixed_facts(handle)
        readings(handle)
        lists(handle)
    own_process(pynvml.nvmlDeviceGetHandleByIndex(0))
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
