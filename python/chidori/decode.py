"""Server-side decode: Hugging Face ``generate`` with the token loop on the GPU machine.

Through ``chidori run``, every decode step of plain ``generate`` waits for the server at
least once (the host reads whether the sequences are done), so at 70 ms round-trip time a
model decodes at most ~14 tokens per second. Under :func:`optimize`, ``generate`` captures
one decode step as a CUDA graph -- the forward pass, token selection, and the next step's
inputs, all on the device -- and asks the server to replay it until every sequence has
ended (``chidori_loop_start``: a generic graph-replay loop of Chidori's protocol). Tokens
stream back while the loop runs; the result is what ``generate`` would have returned. The
graph also writes each token into the whole output, which the loop's closing copy puts in
the tensor returned: nothing is sent after the loop, so a synchronize after ``generate``
costs no round trip.

What the fast path does not cover (beam search, assisted decoding, logits processors and
stopping criteria other than temperature/top-k/top-p/min-p, minimum lengths, EOS and
length limits, ``return_dict_in_generate``, encoder-decoder models, ...) runs through the
original ``generate``, after one log line that says why.

Greedy decoding gives the tokens of native ``generate`` with a static cache: the prefill
and every step run the same model code on the same inputs. Sampling draws from the same
distribution with uniform numbers drawn beforehand by torch's CUDA generator (the inverse
of the cumulative distribution), since a replayed graph cannot advance torch's RNG itself.
A dynamic cache request uses a static cache, and says so once.

Nothing here imports torch or transformers until it is used.
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import inspect
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

_log = logging.getLogger("chidori")
_said: set[str] = set()
_enabled = False
_original_generate: Optional[Callable[..., Any]] = None
_hook_installed = False

# Decode steps between two looks at the stop flag on the server, and how often tokens
# stream back while a streamer listens.
CHECK_EVERY = 8
PROGRESS_MS = 100


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        _log.warning("chidori: %s", message)


class _Unsupported(Exception):
    """The fast path cannot run this call; the message says why."""


# ---- The loop API of libchidori.so ----

def _loop_api() -> Optional[ctypes.CDLL]:
    """libchidori's loop functions in this process, or None when not under ``chidori run``."""
    try:
        lib = ctypes.CDLL(None)
        start = lib.chidori_loop_start
    except (OSError, AttributeError):
        return None
    start.restype = ctypes.c_uint64
    start.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64,
                      ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                      ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
    lib.chidori_loop_poll.restype = ctypes.c_int64
    lib.chidori_loop_poll.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                      ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                                      ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_int64)]
    lib.chidori_loop_end.restype = None
    lib.chidori_loop_end.argtypes = [ctypes.c_uint64]
    return lib


def _read_is_local(tensor: Any) -> bool:
    """Whether reading ``tensor`` back would be answered by this process's Chidori client
    (bytes it copied to the GPU itself, as ``tokenizer(...).to("cuda")`` does, with nothing
    sent since): then reading it costs no round trip."""
    if tensor.device.type != "cuda" or not tensor.is_contiguous():
        return False
    try:
        query = ctypes.CDLL(None).chidori_read_is_local
    except (OSError, AttributeError):
        return False
    query.restype = ctypes.c_int
    query.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    return bool(query(tensor.data_ptr(), tensor.numel() * tensor.element_size()))


@dataclass
class LoopResult:
    """How a server-side loop ended."""

    steps: int
    stopped_at: int
    status: int


# chidori_loop_start's flag: also send the output slot after the last step.
LOOP_TAIL = 1


def run_loop(exec_handle: int, stream: int, max_steps: int, check_every: int, stop_flag: int, output: int,
             bytes_per_step: int, progress_ms: int, on_output: Optional[Callable[[bytes], None]] = None,
             tail: bool = False, on_started: Optional[Callable[[], None]] = None,
             then_copy: Optional[tuple[int, int, int]] = None) -> LoopResult:
    """Replay the graph ``exec_handle`` on ``stream`` on the server (see the module doc):
    ``on_output`` receives each step's output bytes, in order, as they arrive; with ``tail``,
    a loop that ran ``max_steps`` also sends the slot after the last step. ``on_started``
    runs once the loop was asked for, before the first output is awaited. ``then_copy``
    (destination, source, bytes: device addresses) is copied on the stream after the last
    step: with nothing sent meanwhile, the device is then idle without asking."""
    lib = _loop_api()
    if lib is None:
        raise RuntimeError("chidori: not running under `chidori run` (no libchidori in this process)")
    dst, src, nbytes = then_copy or (0, 0, 0)
    loop_id = lib.chidori_loop_start(exec_handle, stream, max_steps, check_every, stop_flag, output,
                                     bytes_per_step, progress_ms, LOOP_TAIL if tail else 0, dst, src, nbytes)
    if not loop_id:
        raise RuntimeError("chidori: the server could not start the graph loop (see the log)")
    buf = ctypes.create_string_buffer(max(1 << 16, bytes_per_step))
    steps, stopped, done, status = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_int64()
    pending = b""
    try:
        if on_started is not None:
            on_started()
        while True:
            n = lib.chidori_loop_poll(loop_id, buf, len(buf), 200, ctypes.byref(steps), ctypes.byref(stopped),
                                      ctypes.byref(done), ctypes.byref(status))
            if n < 0:
                raise RuntimeError("chidori: lost the graph loop")
            if n and on_output is not None and bytes_per_step:
                pending += buf.raw[:n]
                whole = len(pending) // bytes_per_step * bytes_per_step
                for at in range(0, whole, bytes_per_step):
                    on_output(pending[at:at + bytes_per_step])
                pending = pending[whole:]
            if done.value:
                return LoopResult(steps.value, stopped.value, status.value)
    finally:
        lib.chidori_loop_end(loop_id)


# ---- What a generate call asks for ----

@dataclass
class _Plan:
    input_ids: Any
    attention_mask: Any
    max_new: int
    # EOS is masked out of the scores while fewer tokens than this have been generated.
    min_new: int
    eos: Optional[list[int]]
    pad: Optional[int]
    do_sample: bool
    warpers: list[Any]
    streamer: Any
    # Whether some sequence of the prompt has padding (its mask a zero).
    padded: bool
    key: tuple[Any, ...] = field(default=())
    # The prompt, where the host read it (to see its padding): the streamer's first put.
    input_ids_host: Any = None


# Keyword arguments of generate the fast path understands besides generation settings.
_INPUT_KWARGS = {"attention_mask", "streamer", "use_cache", "input_ids", "inputs"}
_WARPERS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper"}
_LENGTH_PROCESSORS = {"MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor"}


def _plan(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], prompt_host: Any = None) -> _Plan:
    """What ``generate(*args, **kwargs)`` asks for, where the fast path can do it.
    ``prompt_host``: the input ids and attention mask (or None) as host tensors, where the
    caller has them (then neither is read back from the GPU)."""
    import torch

    kwargs = dict(kwargs)
    input_ids = kwargs.pop("input_ids", None)
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    if args:
        if input_ids is not None or len(args) > 1:
            raise _Unsupported("positional arguments other than the input ids")
        input_ids = args[0]
    on_cpu_for_tests = os.environ.get("CHIDORI_DECODE_REPLAY") == "eager"
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or (
            input_ids.device.type != "cuda" and not on_cpu_for_tests):
        raise _Unsupported("input ids that are not a 2D tensor on a CUDA device")
    if getattr(model.config, "is_encoder_decoder", False):
        raise _Unsupported("encoder-decoder models")
    for name in ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "assistant_model",
                 "negative_prompt_ids", "past_key_values", "synced_gpus", "custom_generate"):
        if kwargs.pop(name, None) not in (None, [], ()):
            raise _Unsupported(f"`{name}`")
    config = copy.deepcopy(kwargs.pop("generation_config", None) or model.generation_config)
    cache_implementation = kwargs.pop("cache_implementation", None) or config.cache_implementation
    config.cache_implementation = None
    kwargs.pop("disable_compile", None)
    unused = config.update(**kwargs)
    unknown = set(unused) - _INPUT_KWARGS
    if unknown:
        raise _Unsupported(f"arguments {sorted(unknown)}")
    if kwargs.get("use_cache") is False or not getattr(config, "use_cache", True):
        raise _Unsupported("use_cache=False")
    if cache_implementation not in (None, "static", "dynamic"):
        raise _Unsupported(f"cache_implementation={cache_implementation!r}")
    if cache_implementation != "static":
        _say_once("optimize(): generate runs with a static cache on the server (a dynamic one was asked for)")
    if (config.num_beams or 1) != 1 or (config.num_return_sequences or 1) != 1:
        raise _Unsupported("beam search or several sequences per prompt")
    if config.return_dict_in_generate or config.output_scores or config.output_logits:
        raise _Unsupported("return_dict_in_generate / output_scores")
    if getattr(config, "prefill_chunk_size", None):
        raise _Unsupported("chunked prefill")
    length = input_ids.shape[1]
    max_new = config.max_new_tokens if config.max_new_tokens is not None else (config.max_length or 20) - length
    if max_new < 1:
        raise _Unsupported("no new tokens to generate")
    eos = config.eos_token_id
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    if isinstance(eos, int):
        eos = [eos]
    eos = list(eos) if eos else None
    pad = config.pad_token_id
    if isinstance(pad, torch.Tensor):
        pad = int(pad)
    if eos and pad is None:
        pad = eos[0]
    min_new = max(config.min_new_tokens or 0, (config.min_length or 0) - length, 0)
    # Whether the prompt is padded decides the model's attention path, as in generate. Where
    # the host cannot know (a mask was given, or padding is inferred where the pad token
    # occurs, as generate infers it), the prompt and its mask are read in one copy: through
    # Chidori each read waits for the server. Without either, or where the caller gave them
    # as host tensors (server_decode), nothing is read.
    mask = unused.get("attention_mask")
    ids_host, mask_host = prompt_host if prompt_host is not None else (None, None)
    if ids_host is not None and tuple(ids_host.shape) != tuple(input_ids.shape):
        ids_host, mask_host = None, None
    if mask is not None:
        mask = mask.to(input_ids.device)
        if mask.shape != input_ids.shape:
            raise _Unsupported("an attention mask of another shape than the input ids")
        if ids_host is None or mask_host is None:
            if _read_is_local(input_ids) and _read_is_local(mask):
                ids_host, mask_host = input_ids.cpu(), mask.cpu()  # both answered by the client
            else:
                both = torch.stack([input_ids, mask.to(input_ids.dtype)]).cpu()
                ids_host, mask_host = both[0], both[1]
        padded = bool((mask_host == 0).any())
    elif pad is not None and pad not in (eos or []):
        if ids_host is None:
            ids_host = input_ids.cpu()
        padded = bool((ids_host == pad).any())
        mask = input_ids.ne(pad) if padded else torch.ones_like(input_ids)
    else:
        mask, padded = torch.ones_like(input_ids), False
    # The processors generate would use: only those the fast path reproduces on the device.
    # They are made on the host, where checks of their tensors (EOS ids, encoder ids) do not
    # wait for the GPU: the warpers kept hold no tensors, the length processors are redone on
    # the device, and only encoder-side processors (refused) read the stand-in prompt.
    stand_in = ids_host if ids_host is not None else torch.zeros(input_ids.shape, dtype=input_ids.dtype)
    processors = model._get_logits_processor(generation_config=config, input_ids_seq_length=length,
                                             encoder_input_ids=stand_in, prefix_allowed_tokens_fn=None,
                                             logits_processor=None, device="cpu", model_kwargs={})
    warpers = []
    for p in processors:
        name = type(p).__name__
        if name in _WARPERS:
            warpers.append(p)
        elif name not in _LENGTH_PROCESSORS:
            raise _Unsupported(f"the logits processor {name}")
    streamer = unused.get("streamer")
    key = (id(model), tuple(input_ids.shape), max_new, min_new, tuple(eos or ()), pad, bool(config.do_sample),
           tuple(repr(vars(w)) for w in warpers), str(model.dtype))
    return _Plan(input_ids, mask.to(torch.long), max_new, min_new, eos, pad, bool(config.do_sample), warpers,
                 streamer, padded, key, ids_host)


# ---- The decode state a graph is captured over ----

class _Decoder:
    """The static cache, the device buffers of one decode step, and the graph of it."""

    def __init__(self, model: Any, plan: _Plan) -> None:
        import torch
        from transformers import StaticCache

        self.model = model
        self.plan = plan
        batch, length = plan.input_ids.shape
        device = plan.input_ids.device
        self.total = length + plan.max_new
        try:
            self.cache = StaticCache(config=model.config, max_cache_len=self.total)
        except TypeError:
            self.cache = StaticCache(config=model.config, max_batch_size=batch, max_cache_len=self.total,
                                     device=device, dtype=model.dtype)
        if any(getattr(self.cache, "is_sliding", []) or []):
            raise _Unsupported("sliding-window caches")
        long = dict(dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, 1, **long)
        self.positions = torch.zeros(batch, 1, **long)
        self.step = torch.zeros(1, **long)
        self.unfinished = torch.ones(batch, **long)
        self.rows = torch.zeros(plan.max_new, batch, **long)
        # The whole output, as generate returns it (the prompt, then each step's tokens at
        # column `col`): copied out by the loop's closing copy, so nothing follows the loop.
        self.seq = torch.zeros(batch, self.total, **long)
        self.col = torch.zeros(1, **long)
        self.stop = torch.zeros(1, dtype=torch.int32, device=device)
        self.mask = torch.ones(batch, self.total, **long)
        self.eos = torch.tensor(plan.eos, **long) if plan.eos else None
        self.uniform = torch.zeros(plan.max_new, batch, dtype=torch.float32, device=device)
        forward = inspect.signature(model.forward).parameters
        self.extra = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        prepare = inspect.signature(model.prepare_inputs_for_generation).parameters
        self.cache_key = "past_key_values" if "past_key_values" in prepare else "cache"
        self.graph: Any = None
        self.exec_handle = 0

    def select(self, logits: Any, generated: Any) -> Any:
        """The next tokens from the last position's logits, as generate selects them;
        ``generated`` (a device scalar) counts the tokens generated before this one."""
        import torch

        plan = self.plan
        scores = logits[:, -1].to(copy=True, dtype=torch.float32)
        if plan.min_new > 0 and self.eos is not None:
            vocab = torch.arange(scores.shape[-1], device=scores.device)
            banned = torch.isin(vocab, self.eos) & (generated < plan.min_new)
            scores = torch.where(banned, -float("inf"), scores)
        for warper in plan.warpers:
            scores = warper(self.tokens, scores)
        if not plan.do_sample:
            return torch.argmax(scores, dim=-1)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        cdf = probs.cumsum(-1)
        u = self.uniform.index_select(0, generated.reshape(1)).reshape(-1, 1) * cdf[:, -1:]
        return torch.searchsorted(cdf, u, right=True).clamp_(max=scores.shape[-1] - 1).reshape(-1)

    def finish(self, tokens: Any) -> Any:
        """Pad the tokens of finished sequences; update which are finished and the stop flag."""
        import torch

        if self.eos is None:
            return tokens
        pad = self.plan.pad if self.plan.pad is not None else 0
        tokens = tokens * self.unfinished + pad * (1 - self.unfinished)
        self.unfinished.mul_((~torch.isin(tokens, self.eos)).to(torch.long))
        self.stop.copy_((self.unfinished.max() == 0).to(torch.int32).reshape(1))
        return tokens

    def prefill(self) -> None:
        """The prompt's forward pass and the first token, eagerly (as generate runs it: a
        graph of it would take another attention path than generate's, and other numbers).
        What the model would read from the GPU to choose its path is known here: the cache
        is empty, and the plan knows whether the prompt is padded. Given those answers it
        chooses generate's path without waiting for the GPU."""
        import torch

        plan = self.plan
        batch, length = plan.input_ids.shape
        self.cache.reset()
        self.unfinished.fill_(1)
        self.stop.zero_()
        self.mask.fill_(1)
        self.mask[:, :length].copy_(plan.attention_mask)
        if plan.do_sample:
            self.uniform.uniform_()
        positions = plan.attention_mask.cumsum(-1) - 1
        positions = positions.masked_fill(plan.attention_mask == 0, 0)
        # An all-ones mask is what generate would find all ones (and then drop): without it
        # the model makes the same causal-attention choice without reading the mask.
        mask = plan.attention_mask if plan.padded else None
        with _empty_cache_length(self.cache):
            inputs = self.model.prepare_inputs_for_generation(
                plan.input_ids, **{self.cache_key: self.cache}, attention_mask=mask,
                position_ids=positions, use_cache=True, is_first_iteration=True, **self.extra)
            logits = self.model(**inputs, return_dict=True).logits
        self.step.zero_()
        first = self.finish(self.select(logits, self.step))
        self.rows[0].copy_(first)
        self.seq[:, :length].copy_(plan.input_ids)
        self.seq[:, length].copy_(first)
        self.col.fill_(length + 1)
        self.tokens.copy_(first.reshape(batch, 1))
        self.positions.copy_(positions[:, -1:] + 1)
        self.step.fill_(1)

    def decode_step(self) -> None:
        """One decode step on device buffers only (what the graph captures)."""
        batch = self.tokens.shape[0]
        inputs = self.model.prepare_inputs_for_generation(
            self.tokens, next_sequence_length=1, **{self.cache_key: self.cache}, attention_mask=self.mask,
            position_ids=self.positions, use_cache=True, **self.extra)
        logits = self.model(**inputs, return_dict=True).logits
        tokens = self.finish(self.select(logits, self.step))
        self.rows.index_copy_(0, self.step, tokens.reshape(1, batch))
        self.seq.index_copy_(1, self.col, tokens.reshape(batch, 1))
        self.col.add_(1)
        self.tokens.copy_(tokens.reshape(batch, 1))
        self.positions.add_(1)
        self.step.add_(1)

    def capture(self) -> None:
        """Capture decode_step as a CUDA graph (after one eager step: the first call allocates)."""
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.decode_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.decode_step()
        exec_of = getattr(graph, "raw_cuda_graph_exec", None)
        if exec_of is None:
            raise _Unsupported("this torch has no CUDAGraph.raw_cuda_graph_exec")
        self.graph = graph
        self.exec_handle = int(exec_of())


@contextlib.contextmanager
def _empty_cache_length(cache: Any) -> Iterator[None]:
    """While the prefill runs, the cache's length is the host's 0, not a read of the GPU's
    counter (the model compares it with 0 to choose its attention path; a reset cache holds
    0, as a new one, whose length generate's first call finds as a host 0)."""
    if "get_seq_length" in vars(cache) or not callable(getattr(cache, "get_seq_length", None)):
        yield
        return
    cache.get_seq_length = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        del cache.get_seq_length


_decoders: dict[tuple[Any, ...], _Decoder] = {}
_decoders_lock = threading.Lock()


class _Streamed:
    """Hands generated rows to the program's streamer as generate would: the prompt first,
    then each step's tokens, up to the step at which every sequence had ended (the loop on
    the server may run a few steps past it before it sees the stop flag)."""

    def __init__(self, streamer: Any, plan: _Plan, batch: int) -> None:
        self.streamer = streamer
        self.plan: Optional[_Plan] = plan
        self.eos = set(plan.eos) if plan.eos else None
        self.finished = [False] * batch
        self.rows = 0
        self.done = False

    def put_prompt(self) -> None:
        """The prompt to the streamer, once, before any row: as the host read it, else read
        now. (Once the loop was started, a read waits one round trip, while the loop runs,
        and behind the few steps launched before it.)"""
        plan, self.plan = self.plan, None
        if plan is not None and self.streamer is not None:
            self.streamer.put(plan.input_ids_host if plan.input_ids_host is not None else plan.input_ids.cpu())

    def put(self, row: Any) -> None:
        if self.done:
            return
        self.put_prompt()
        self.rows += 1
        if self.streamer is not None:
            self.streamer.put(row)
        if self.eos is not None:
            for b, token in enumerate(row.tolist()):
                self.finished[b] = self.finished[b] or token in self.eos
            self.done = all(self.finished)


def _scan(rows: Any, plan: _Plan, steps: int) -> _Streamed:
    """The first ``steps`` rows counted as generate counts them, up to the step where every
    sequence had ended (``done``)."""
    count = _Streamed(None, plan, rows.shape[1])
    for t in range(steps):
        count.put(rows[t])
        if count.done:
            break
    return count


def _generated_length(rows: Any, plan: _Plan, steps: int) -> int:
    """How many tokens generate returns: up to the step where every sequence had ended."""
    return _scan(rows, plan, steps).rows


def _ended_within(rows: Any, plan: _Plan, known: int) -> bool:
    """Whether every sequence has ended within the first ``known`` rows."""
    return _scan(rows, plan, known).done


def _run(model: Any, plan: _Plan, replay: str = "server") -> Any:
    import torch

    with _decoders_lock:
        decoder = _decoders.get(plan.key)
        if decoder is None:
            decoder = _Decoder(model, plan)
            if len(_decoders) >= 8:
                _decoders.pop(next(iter(_decoders)))
            _decoders[plan.key] = decoder
    decoder.plan = plan
    batch, _ = plan.input_ids.shape
    # Nothing below waits for the GPU before the loop runs, once its graph exists: the
    # prefill and the loop's start are sent ahead; a streamer's prompt, where the host has
    # not read it, is read once the loop runs.
    streamed = _Streamed(plan.streamer, plan, batch)
    # The generated rows on the host, `known` of them from the first: those made before the
    # loop (read for a streamer) and those the loop streams back as it runs (with its tail:
    # the row its last step writes). Where they reach max_new_tokens or the end of every
    # sequence, reading the rows again afterwards (one more round trip) is not needed.
    host_rows = torch.zeros(plan.max_new, batch, dtype=torch.long)
    known = 0
    # What generate returns, filled by the loop's closing copy (a new tensor the program owns).
    out = torch.empty(batch, decoder.total, dtype=torch.long, device=plan.input_ids.device)
    with torch.no_grad():
        decoder.prefill()
        start = 1
        if replay == "server" and decoder.graph is None and plan.max_new > 1:
            decoder.capture()  # runs step 1 eagerly first
            start = 2
        remaining = plan.max_new - start
        # The loop streams rows from start - 1 on (its output lags a step: each replay
        # writes the next row); the rows before came from the prefill and the eager step.
        if plan.streamer is not None and start > 1:
            host_rows[:start - 1] = decoder.rows[:start - 1].cpu()
            known = start - 1
            for row in host_rows[:start - 1]:
                streamed.put(row)
        if remaining > 0 and replay == "eager":
            for _ in range(remaining):
                decoder.decode_step()
                if decoder.eos is not None and int(decoder.stop.item()):
                    break
        elif remaining > 0:
            row_bytes = batch * 8
            received = start - 1
            contiguous = known == start - 1

            def on_row(raw: bytes) -> None:
                nonlocal received, known
                row = torch.frombuffer(bytearray(raw), dtype=torch.long)
                if received < plan.max_new:
                    host_rows[received] = row
                received += 1
                if contiguous:
                    known = min(received, plan.max_new)
                if plan.streamer is not None:
                    streamed.put(row)

            result = run_loop(decoder.exec_handle, torch.cuda.current_stream().cuda_stream, remaining, CHECK_EVERY,
                              decoder.stop.data_ptr() if decoder.eos is not None else 0,
                              decoder.rows.data_ptr() + (start - 1) * row_bytes, row_bytes,
                              PROGRESS_MS if plan.streamer is not None else 0, on_row, tail=True,
                              on_started=streamed.put_prompt,
                              then_copy=(out.data_ptr(), decoder.seq.data_ptr(), out.numel() * out.element_size()))
            if result.status:
                raise RuntimeError(f"chidori: the server-side decode loop failed with status {result.status}")
        if replay == "eager" or remaining <= 0:
            out.copy_(decoder.seq)  # the loop ran here, or none was needed (one new token)
        complete = known >= plan.max_new or _ended_within(host_rows, plan, known)
        rows = host_rows if complete else decoder.rows.cpu()
    n = _generated_length(rows, plan, plan.max_new)
    streamed.put_prompt()
    if plan.streamer is not None:
        for row in rows[min(streamed.rows, n):n]:
            streamed.put(row)
        plan.streamer.end()
    width = plan.input_ids.shape[1] + n
    if width == decoder.total or batch == 1:
        return out[:, :width]
    return out[:, :width].contiguous()  # as generate's: a kernel, so a later synchronize waits


# fast_generate's keyword for the prompt's host tensors (server_decode's, never generate's).
_PROMPT_HOST = "_chidori_prompt_host"


def fast_generate(model: Any, *args: Any, **kwargs: Any) -> Any:
    """``model.generate(*args, **kwargs)`` with the token loop on the server where the call
    allows it, else the original ``generate`` (after one log line that says why)."""
    original = _original_generate or type(model).generate
    prompt_host = kwargs.pop(_PROMPT_HOST, None)
    try:
        plan = _plan(model, args, kwargs, prompt_host)
        if _loop_api() is None and os.environ.get("CHIDORI_DECODE_REPLAY") != "eager":
            raise _Unsupported("not running under `chidori run`")
    except _Unsupported as reason:
        _say_once(f"optimize(): generate runs as usual here: {reason}")
        return original(model, *args, **kwargs)
    replay = "eager" if os.environ.get("CHIDORI_DECODE_REPLAY") == "eager" else "server"
    try:
        return _run(model, plan, replay)
    except _Unsupported as reason:
        _say_once(f"optimize(): generate runs as usual here: {reason}")
        return original(model, *args, **kwargs)


def server_decode(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int = 200, **kwargs: Any) -> str:
    """Generate a completion of ``prompt`` with the token loop on the server; the text of
    the new tokens."""
    encoded = tokenizer(prompt, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded.get("attention_mask")
    kwargs.setdefault("cache_implementation", "static")
    # The prompt is known here: whether it is padded is seen on the host, not read back.
    kwargs[_PROMPT_HOST] = (ids, mask)
    out = fast_generate(model, ids.to(model.device), attention_mask=None if mask is None else mask.to(model.device),
                        max_new_tokens=max_new_tokens, **kwargs)
    return str(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


# ---- optimize(): route GenerationMixin.generate through fast_generate ----

def _patch(module: Any) -> None:
    global _original_generate
    mixin = getattr(module, "GenerationMixin", None)
    if mixin is None or getattr(mixin.generate, "_chidori", False):
        return
    _original_generate = mixin.generate
    original = mixin.generate

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _enabled:
            return original(self, *args, **kwargs)
        return fast_generate(self, *args, **kwargs)

    generate._chidori = True  # type: ignore[attr-defined]
    generate.__doc__ = original.__doc__
    generate.__wrapped__ = original  # type: ignore[attr-defined]
    mixin.generate = generate


class _PatchOnImport:
    """A meta-path finder that patches transformers' generate once its module is loaded."""

    target = "transformers.generation.utils"

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.target:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def patched_exec(module: Any) -> None:
            exec_module(module)
            _patch(module)

        loader.exec_module = patched_exec  # type: ignore[method-assign]
        return spec


def optimize(enable: bool = True) -> None:
    """Run Hugging Face ``generate`` with its token loop on the server from now on (before
    or after transformers is imported). Without ``chidori run`` it changes nothing."""
    global _enabled, _hook_installed
    _enabled = enable
    module = sys.modules.get("transformers.generation.utils")
    if module is not None:
        _patch(module)
    elif enable and not _hook_installed:
        sys.meta_path.insert(0, _PatchOnImport())
        _hook_installed = True
