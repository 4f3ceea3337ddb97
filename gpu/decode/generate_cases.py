#!/usr/bin/env python3
"""Hugging Face generate cases for server-side decode: one JSON line per case.

    python3 generate_cases.py [--optimize api|none] [--only a,b] [--new-tokens N]

Models are built from configs with seeded random weights (no downloads): TinyLlama-1.1B's
shape with 22 and 4 layers (fp16), GPT-2 and a Qwen2-style model; one case goes through
`chidori.server_decode` with a word-level tokenizer built in code, and one tokenizes its
prompt and moves it to the GPU inside the timed part, as users write it. Each case prints its
tokens (greedy: compared exactly with the native run; sampling: compared by distribution
statistics), the wall time of the timed generate, the time to the first streamed token
where a streamer listens, tokens per second over the whole generate and, where a streamer
listens, over the tokens after the first (the decode rate, comparable with a graph replay's).
`--sync-debug` reports, to stderr, each place the timed generate made the host wait for the
GPU (torch's sync debug mode), with its Python stack. `--optimize api` calls
`chidori.optimize()` first; `none` runs plain generate (also what `chidori run --optimize`
turns on without a code change).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Optional

import torch

CASES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {}


def case(fn: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[[argparse.Namespace], dict[str, Any]]:
    CASES[fn.__name__] = fn
    return fn


def llama(layers: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers, num_attention_heads=32,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    return build(LlamaForCausalLM, cfg)


def build(cls: Any, cfg: Any) -> Any:
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = cls(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


PROMPT = [1, 15043, 29892, 590, 1024, 338]


class Timer:
    """A streamer that notes when the first generated token arrives."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.count = 0
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        if self.first is None:
            self.first = time.perf_counter() - self.start
        self.count += int(value.numel()) if hasattr(value, "numel") else 1

    def end(self) -> None:
        pass


def report_syncs() -> Callable[[], None]:
    """Print each synchronizing torch call (torch.cuda.set_sync_debug_mode) with the Python
    frames that made it; returns what turns the report off."""
    import traceback
    import warnings

    shown = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if "synchroniz" not in str(message):
            shown(message, category, filename, lineno, file, line)
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename][-10:]
        sys.stderr.write(f"SYNC {str(message).splitlines()[0][:100]}\n")
        sys.stderr.write("".join(f"    {f.filename}:{f.lineno} {f.name}: {(f.line or '').strip()[:120]}\n"
                                 for f in frames))

    warnings.showwarning = show
    filters = warnings.filters[:]
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")

    def stop() -> None:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = shown
        warnings.filters[:] = filters

    return stop


@torch.no_grad()
def timed(model: Any, ids: Any, stream: bool = True, prepare: Optional[Callable[[], dict[str, Any]]] = None,
          **kw: Any) -> dict[str, Any]:
    """The second of two `generate` calls on `ids`, timed; with `prepare`, each call's inputs
    come from it instead, made inside the timed part (`ids`: their shape)."""
    kw.setdefault("do_sample", False)
    kw.setdefault("cache_implementation", "static")
    kw.setdefault("disable_compile", True)
    args = () if prepare else (ids,)
    model.generate(*args, **(prepare() if prepare else {}), **{**kw, "streamer": None})  # warm-up: same shapes
    torch.cuda.synchronize()
    timer = Timer() if stream else None
    t0 = time.perf_counter()
    if timer:
        timer.start = t0
    stop = report_syncs() if os.environ.get("DECODE_SYNC_DEBUG") else None
    try:
        out = model.generate(*args, **(prepare() if prepare else {}), streamer=timer, **kw)
    finally:
        if stop:
            stop()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    new = out[:, ids.shape[1]:]
    first = timer.first if timer and timer.first else None
    after_first = (new.shape[1] - 1) / (secs - first) if first and new.shape[1] > 1 and secs > first else None
    return {"seconds": round(secs, 4), "ttft": round(first, 4) if first else None,
            "streamed": timer.count if timer else None, "new_tokens": int(new.shape[1]),
            "tok_per_s": round(new.shape[1] / secs, 1),
            "decode_tok_per_s": round(after_first, 1) if after_first else None, "tokens": new.tolist()}


@case
def tinyllama22_greedy_200(a: argparse.Namespace) -> dict[str, Any]:
    model = llama(22)
    ids = torch.tensor([PROMPT], device="cuda")
    return timed(model, ids, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens)


@case
def tinyllama22_tokenized_200(a: argparse.Namespace) -> dict[str, Any]:
    """As users write it: the prompt tokenized and moved to the GPU with its mask in the
    timed part (`tokenizer(...).to("cuda")`, then `generate(**inputs)`)."""
    model = llama(22)
    tokenizer = word_tokenizer(32000)
    prompt = " ".join(f"t{i}" for i in PROMPT)
    ids = torch.tensor([PROMPT])
    return timed(model, ids, prepare=lambda: dict(tokenizer(prompt, return_tensors="pt", return_token_type_ids=False).to("cuda")),
                 max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens)


@case
def tinyllama4_greedy_200(a: argparse.Namespace) -> dict[str, Any]:
    model = llama(4)
    ids = torch.tensor([PROMPT], device="cuda")
    return timed(model, ids, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens)


@case
def tinyllama4_eos_midway(a: argparse.Namespace) -> dict[str, Any]:
    model = llama(4)
    ids = torch.tensor([PROMPT], device="cuda")
    ref = model.generate(ids, max_new_tokens=40, do_sample=False, cache_implementation="static", disable_compile=True)
    eos = int(ref[0, len(PROMPT) + 25])
    return timed(model, ids, max_new_tokens=100, eos_token_id=eos) | {"eos": eos}


@case
def tinyllama4_batch4_padded(a: argparse.Namespace) -> dict[str, Any]:
    model = llama(4)
    ids = torch.tensor([PROMPT, [0, 0] + PROMPT[:4], [0] + PROMPT[1:], [7, 8, 9, 10, 11, 12]], device="cuda")
    mask = (ids != 0).long()
    mask[3] = 1
    return timed(model, ids, stream=False, attention_mask=mask, max_new_tokens=64, pad_token_id=0)


@case
def tinyllama4_sampling(a: argparse.Namespace) -> dict[str, Any]:
    model = llama(4)
    ids = torch.tensor([PROMPT] * 8, device="cuda")
    torch.manual_seed(1234)
    r = timed(model, ids, stream=False, max_new_tokens=64, do_sample=True, temperature=0.8, top_k=50, top_p=0.95)
    toks = torch.tensor(r["tokens"])
    # Statistics comparable across runs (sampling draws differ): distinct tokens, entropy.
    counts = torch.bincount(toks.flatten(), minlength=32000).float()
    p = counts[counts > 0] / counts.sum()
    r["distinct"] = int((counts > 0).sum())
    r["entropy_bits"] = round(float(-(p * p.log2()).sum()), 3)
    r["tokens"] = r["tokens"][:1]
    return r


@case
def gpt2_greedy(a: argparse.Namespace) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = build(GPT2LMHeadModel, GPT2Config(n_layer=6, n_embd=768, n_head=12, vocab_size=50257))
    ids = torch.tensor([[464, 2068, 7586, 21831, 18045, 625]], device="cuda")
    return timed(model, ids, max_new_tokens=64)


@case
def qwen2_greedy(a: argparse.Namespace) -> dict[str, Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=2, vocab_size=32000, max_position_embeddings=2048)
    model = build(Qwen2ForCausalLM, cfg)
    ids = torch.tensor([PROMPT], device="cuda")
    return timed(model, ids, max_new_tokens=64)


def chidori_package() -> Any:
    """The chidori package: installed, or this repository's."""
    try:
        import chidori
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
        import chidori
    return chidori


def word_tokenizer(vocab_size: int) -> Any:
    """A tokenizer built in code (no downloads): words `t0` ... `t{vocab_size - 1}`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0")


@case
def tinyllama4_server_decode(a: argparse.Namespace) -> dict[str, Any]:
    """`chidori.server_decode` (outside `chidori run`: generate as usual), text compared."""
    server_decode = chidori_package().server_decode
    model = llama(4)
    tokenizer = word_tokenizer(32000)
    prompt = " ".join(f"t{i}" for i in PROMPT)
    server_decode(model, tokenizer, prompt, max_new_tokens=64)  # warm-up: same shapes
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    text = server_decode(model, tokenizer, prompt, max_new_tokens=64)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    words = text.split()
    return {"seconds": round(secs, 4), "new_tokens": len(words), "tok_per_s": round(len(words) / secs, 1),
            "tokens": words}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--optimize", choices=["api", "none"], default="none")
    p.add_argument("--only", default="")
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--sync-debug", action="store_true", help="report where the timed generate waits (stderr)")
    a = p.parse_args()
    if a.sync_debug:
        os.environ["DECODE_SYNC_DEBUG"] = "1"
    if a.optimize == "api":
        chidori_package().optimize()
    names = a.only.split(",") if a.only else list(CASES)
    for name in names:
        t0 = time.perf_counter()
        try:
            record = {"case": name, "ok": True, **CASES[name](a)}
        except Exception as e:  # noqa: BLE001 - a failing case is reported, the next runs
            where = "".join(traceback.format_tb(e.__traceback__)[-4:])
            record = {"case": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:500], "where": where[-2000:]}
        record["case_seconds"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(record), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
