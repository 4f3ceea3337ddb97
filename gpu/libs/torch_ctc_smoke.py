#!/usr/bin/env python3
"""PyTorch's CTC loss through cuDNN's v7 API (`_cudnn_ctc_loss`).

torch takes that path when the targets are a 1-D int32 tensor on the CPU, the lengths are
lists, every input is as long as the log-probabilities, the blank is 0 and the label lengths
are below 256 (torch's own `test_CTCLoss_cudnn`): cuDNN then reads host arrays whose
lengths only the data gives. Prints the losses and gradients, with cuDNN and without it,
rounded to 4 significant digits; run natively and through `chidori run`, the two outputs
must be equal.
"""

import torch


def show(label: str, value: torch.Tensor) -> None:
    """One result line: shape, the first and last values and the sum, rounded."""
    flat = value.double().ravel()
    picks = [flat[0], flat[-1], flat.sum()]
    print(label, tuple(value.shape), " ".join(f"{v.item():.4g}" for v in picks))


def main() -> None:
    print("cudnn", torch.backends.cudnn.version())
    torch.manual_seed(0)
    target_lengths = [30, 25, 20]
    input_lengths = [50, 50, 50]
    targets = torch.randint(1, 15, (sum(target_lengths),), dtype=torch.int)
    log_probs = torch.randn(50, 3, 15, dtype=torch.float, device="cuda").log_softmax(2).detach()
    for cudnn in (True, False):
        with torch.backends.cudnn.flags(enabled=cudnn):
            x = log_probs.clone().requires_grad_()
            loss = torch.nn.functional.ctc_loss(x, targets, input_lengths, target_lengths, reduction="none")
            loss.sum().backward()
        assert x.grad is not None
        show(f"loss cudnn={cudnn}", loss)
        show(f"grad cudnn={cudnn}", x.grad)


if __name__ == "__main__":
    main()
