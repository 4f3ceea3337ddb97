#!/usr/bin/env python3
"""Record a GPU's device profile for Chidori's emulated backend and handshake tests.

Run on a machine with the real driver. Queries every CUdevice_attribute that the CUDA 13.0
headers define (read from Chidori's IR, generated/ir/13.0/driver.jsonl), the device's name,
UUID and memory, the driver and runtime versions, and cudaGetDeviceProperties decoded
field by field with the 13.0 layout (generated/ir/13.0/cudart.jsonl). Prints JSON.

    python3 gpu/record_profile.py [--cudart PATH] > profile.json
"""
import argparse
import ctypes
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ir(version, library):
    items = []
    with open(os.path.join(ROOT, "generated", "ir", version, library + ".jsonl")) as f:
        for line in f:
            items.append(json.loads(line))
    return items


def find_cudart():
    for pattern in ["/opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcudart.so.13",
                    "/usr/local/lib/python3*/*-packages/nvidia/cu13/lib/libcudart.so.13",
                    "/usr/local/cuda*/lib64/libcudart.so.13"]:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return "libcudart.so.13"


def check(rc, what):
    if rc != 0:
        raise SystemExit(f"{what} failed with status {rc}")


def decode(raw, record, records):
    """Field values of a record (ints, strings for char arrays, lists for arrays)."""
    out = {}
    prims = {"i8": ("b", 1), "u8": ("B", 1), "i16": ("h", 2), "u16": ("H", 2), "i32": ("i", 4),
             "u32": ("I", 4), "i64": ("q", 8), "u64": ("Q", 8), "usize": ("Q", 8), "f32": ("f", 4),
             "f64": ("d", 8)}
    import struct
    for field in record["fields"]:
        ty, off = field["ty"], field["offset"]
        if off > 1 << 40:
            continue
        if ty.startswith("[i8; "):
            n = int(ty[5:-1])
            out[field["name"]] = raw[off:off + n].split(b"\0")[0].decode("utf-8", "replace")
        elif ty.startswith("["):
            inner, n = ty[1:-1].rsplit(";", 1)
            inner, n = inner.strip(), int(n)
            if inner in prims:
                code, size = prims[inner]
                out[field["name"]] = [struct.unpack_from("<" + code, raw, off + i * size)[0] for i in range(n)]
        elif ty in prims:
            code, _ = prims[ty]
            out[field["name"]] = struct.unpack_from("<" + code, raw, off)[0]
        elif ty in records:
            sub = records[ty]
            out[field["name"]] = raw[off:off + sub["size"]].hex()
        else:
            out[field["name"]] = raw[off:off + 4].hex()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cudart", default=None)
    a = p.parse_args()
    driver_ir = ir("13.0", "driver")
    cudart_ir = ir("13.0", "cudart")
    attrs = next(i for i in driver_ir if i.get("kind") == "enum" and i["name"] == "CUdevice_attribute_enum")
    records = {i["name"]: i for i in cudart_ir if i.get("kind") == "record"}
    # Typedef names of records (cudaUUID_t → CUuuid_st) decode as the record.
    for i in cudart_ir:
        if i.get("kind") == "typedef" and i["ty"] in records:
            records[i["name"]] = records[i["ty"]]
    prop = records["cudaDeviceProp"]

    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0), "cuInit")
    ver = ctypes.c_int()
    check(cuda.cuDriverGetVersion(ctypes.byref(ver)), "cuDriverGetVersion")
    count = ctypes.c_int()
    check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    cudart = ctypes.CDLL(a.cudart or find_cudart())
    rt_ver = ctypes.c_int()
    cudart.cudaRuntimeGetVersion(ctypes.byref(rt_ver))
    devices = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        check(cuda.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        name = ctypes.create_string_buffer(256)
        check(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
        total = ctypes.c_size_t()
        check(cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev), "cuDeviceTotalMem_v2")
        uuid = ctypes.create_string_buffer(16)
        check(cuda.cuDeviceGetUuid_v2(uuid, dev), "cuDeviceGetUuid_v2")
        values = {}
        for v in attrs["variants"]:
            if v["name"].endswith("_MAX"):
                continue
            out = ctypes.c_int()
            rc = cuda.cuDeviceGetAttribute(ctypes.byref(out), v["value"], dev)
            values[v["name"]] = {"value": v["value"], "result": out.value if rc == 0 else None, "status": rc}
        ctx = ctypes.c_void_p()
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        free, total2 = ctypes.c_size_t(), ctypes.c_size_t()
        check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total2)), "cuMemGetInfo_v2")
        raw = ctypes.create_string_buffer(prop["size"] + 64)
        check(cudart.cudaGetDeviceProperties(raw, ordinal), "cudaGetDeviceProperties")
        devices.append({
            "ordinal": ordinal,
            "name": name.value.decode(),
            "uuid": uuid.raw.hex(),
            "total_mem": total.value,
            "free_mem_at_record": free.value,
            "attributes": values,
            "cudaDeviceProp_13_0": decode(raw.raw, prop, records),
        })
    print(json.dumps({
        "recorded_with": "gpu/record_profile.py",
        "driver_version": ver.value,
        "runtime_version": rt_ver.value,
        "devices": devices,
    }, indent=1, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
