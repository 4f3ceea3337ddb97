#!/usr/bin/env python3
"""`torch_ipc_smoke.py` with expandable segments: torch then shares its segments as POSIX file
descriptors (`cuMemExportToShareableHandle`, fetched by the receiving process with
`pidfd_getfd`) instead of legacy IPC handles. Run natively and through `chidori run`, the two
outputs must be equal.
"""

import os

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch_ipc_smoke  # noqa: E402  (the allocator reads its setting when CUDA starts)

if __name__ == "__main__":
    torch_ipc_smoke.main()
