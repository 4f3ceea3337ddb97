#!/usr/bin/env python3
"""CUDA tensors shared between processes by `torch.multiprocessing` (CUDA IPC).

The parent puts a CUDA tensor on a queue; a child process (spawned, so a session of its own
through Chidori) receives it by its IPC handle, reads it, adds to it in place and records the
event torch sends with it; the parent then sees the child's writes. Also a tensor made by the
child and sent back. Prints rounded values; run natively and through `chidori run`, the two
outputs must be equal.
"""

import torch
import torch.multiprocessing as mp


def child(inbox: "mp.Queue[torch.Tensor]", outbox: "mp.Queue[object]") -> None:
    """Reads the parent's tensor, adds 1 to it in place and sends back its sum and a new tensor."""
    shared = inbox.get()
    before = shared.sum().item()
    shared.add_(1.0)
    torch.cuda.synchronize()
    made = torch.arange(8, device="cuda", dtype=torch.float32) * 3
    outbox.put((before, made))
    # The parent holds `made` by its handle until it says it is done with it.
    inbox.get()


def main() -> None:
    """Shares a 1M-element tensor with a child and checks both directions."""
    mp.set_start_method("spawn")
    tensor = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    inbox: "mp.Queue[object]" = mp.Queue()
    outbox: "mp.Queue[object]" = mp.Queue()
    worker = mp.Process(target=child, args=(inbox, outbox))
    worker.start()
    inbox.put(tensor)
    before, made = outbox.get(timeout=120)
    print("child read", f"{before:.6g}")
    print("parent sees", f"{tensor.sum().item():.6g}", f"{tensor[:3].tolist()}")
    print("child made", made.tolist())
    del made
    inbox.put(None)
    worker.join(timeout=120)
    print("child exit", worker.exitcode)


if __name__ == "__main__":
    main()
