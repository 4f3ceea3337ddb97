#!/usr/bin/env python3
"""torchvision's GPU JPEG decoding (nvJPEG, a library Chidori does not forward: it runs in the
program and reaches the GPU through Chidori's runtime and driver). Prints the decoded
image's shape and checksum, or why it could not run; natively and remotely they must agree.
"""

import torch


def main() -> None:
    try:
        import torchvision
        from torchvision.io import decode_jpeg, encode_jpeg
    except ImportError as e:
        print("no torchvision:", e)
        return
    image = (torch.arange(3 * 64 * 96, dtype=torch.int64) % 251).to(torch.uint8).reshape(3, 64, 96)
    data = encode_jpeg(image, quality=90)
    print("torchvision", torchvision.__version__, "jpeg bytes", data.numel())
    decoded = decode_jpeg(data, device="cuda")
    print("decoded", tuple(decoded.shape), decoded.device.type, int(decoded.to(torch.int64).sum().item()))
    cpu = decode_jpeg(data)
    difference = (decoded.cpu().to(torch.int16) - cpu.to(torch.int16)).abs().max()
    print("max difference to the CPU decoder", int(difference))


if __name__ == "__main__":
    main()
