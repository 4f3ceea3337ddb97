"""Probe: where does plain `generate` synchronize the host with the GPU, per token?

Runs the standard decode workload's model (dynamic cache) natively with torch's sync debug
mode on: every synchronizing CUDA operation torch makes raises a warning, recorded here
with the Python stack at that moment. Prints, for 8 and 32 new tokens, each distinct site
(its four innermost Python frames) with its count, and the difference per token: what a remote run must wait for on every token unless it can answer
it itself.

    python3 gpu/probes/decode_syncs.py target/dist/shared/workloads
"""

import collections
import collections.abc
import sys
import traceback
import warnings

import torch


def sites(generate: collections.abc.Callable[[], object]) -> collections.Counter[str]:
    """The synchronizing operations `generate` makes, by the Python frames that made them."""
    seen: collections.Counter[str] = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if "synchronizing" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
        inner = ["/".join(f.filename.rsplit("/", 2)[-2:]) + f":{f.lineno} {f.name}" for f in frames[-4:]]
        seen[" <- ".join(reversed(inner))] += 1

    # catch_warnings puts the filters and showwarning back as it found them.
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            generate()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return seen


def main() -> None:
    sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "target/dist/shared/workloads")
    from decode import PROMPT, build  # type: ignore[import-not-found]

    _, model = build(4)
    ids = torch.tensor([PROMPT], device="cuda")
    kw = dict(do_sample=False, disable_compile=True)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, **kw)
        torch.cuda.synchronize()
        counts = {
            n: sites(lambda n=n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)) for n in (8, 32)
        }
    for site in sorted(set(counts[8]) | set(counts[32]), key=lambda s: -counts[32][s]):
        a, b = counts[8][site], counts[32][site]
        print(f"{a:4d} {b:4d}  {(b - a) / 24:5.2f}/token  {site}")
    total = (sum(counts[32].values()) - sum(counts[8].values())) / 24
    print(f"synchronizing operations per token: {total:.2f}")


if __name__ == "__main__":
    main()
