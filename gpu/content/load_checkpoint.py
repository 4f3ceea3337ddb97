"""Load a checkpoint from disk onto the GPU, as a training or inference script starts.

    python3 load_checkpoint.py make DIR [--gb 2]     write DIR/model.safetensors and DIR/model.pt
    python3 load_checkpoint.py load DIR --format safetensors|torch

`make` writes the same deterministic weights (a transformer-like set of fp16 matrices) in
both formats; `load` reads one onto `cuda`, synchronizes and prints one JSON line:
seconds, bytes on the GPU and a checksum of what arrived (the same natively and remotely).
Used by `gpu/round.sh content` to see what a second run of the same load sends.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def make(directory: Path, gigabytes: float) -> None:
    """Write about `gigabytes` of fp16 weights in both formats."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    total, layer = 0, 0
    target = int(gigabytes * (1 << 30))
    while total < target:
        for name, shape in (("attn.qkv", (4096, 3 * 4096)), ("attn.out", (4096, 4096)), ("mlp.up", (4096, 11008)),
                            ("mlp.down", (11008, 4096)), ("norm", (4096,))):
            t = torch.randn(shape, generator=generator, dtype=torch.float32).to(torch.float16)
            tensors[f"layers.{layer}.{name}"] = t
            total += t.numel() * t.element_size()
        layer += 1
    save_file(tensors, str(directory / "model.safetensors"))
    torch.save(tensors, directory / "model.pt")
    print(json.dumps({"tensors": len(tensors), "bytes": total}))


def load(directory: Path, fmt: str) -> None:
    """Load one format onto the GPU and report."""
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    start = time.perf_counter()
    if fmt == "safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(directory / "model.safetensors"), device="cuda")
    else:
        tensors = torch.load(directory / "model.pt", map_location="cuda", weights_only=True)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    # One read back for the checksum (each would be a round trip far from the GPU).
    names = sorted(tensors)
    checksum = float(torch.stack([tensors[n].float().sum() for n in names]).double().sum().item())
    size = sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    print(json.dumps({"format": fmt, "seconds": round(seconds, 3), "bytes": size, "checksum": round(checksum, 3)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["make", "load"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--format", choices=["safetensors", "torch"], default="safetensors")
    args = parser.parse_args()
    if args.action == "make":
        make(args.directory, args.gb)
    else:
        load(args.directory, args.format)


if __name__ == "__main__":
    main()
