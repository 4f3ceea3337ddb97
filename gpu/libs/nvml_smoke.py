#!/usr/bin/env python3
"""NVML as pynvml (nvidia-ml-py) uses it: driver and NVML versions, then per GPU its name,
UUID, PCI bus id, total memory and BAR1 size, and that utilization and used memory read.

Prints only values that do not change from run to run (utilization and used memory are
checked for range, not printed); run natively and through `chidori run`, the two outputs
must be equal.
"""

import pynvml


def text(value: "str | bytes") -> str:
    """pynvml returns str or bytes depending on its version."""
    return value.decode() if isinstance(value, bytes) else value


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
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
