"""Server-side decode on the CPU, where torch and transformers are installed (skipped
elsewhere): a tiny Llama built from a config, generate natively against the fast path with
the server's loop simulated (each step's output lags a step, as the worker sends it).
Tokens and what a streamer receives must be native; rows streamed back are not read again
when they reach max_new_tokens or the end of every sequence."""

import ctypes
import importlib.util
import os
import unittest
from typing import Any, Callable, Optional
from unittest import mock

HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


class Recorder:
    """A streamer that keeps what it is given."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def put(self, value: Any) -> None:
        self.got.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.got.append("end")


@unittest.skipUnless(HAVE_TORCH, "needs torch and transformers")
class FastPathOnCpu(unittest.TestCase):
    def setUp(self) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        import chidori.decode as decode

        self.torch, self.decode = torch, decode
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             pad_token_id=0, eos_token_id=None)
        self.model = LlamaForCausalLM(config).eval()
        self.ids = torch.randint(6, 97, (2, 7))
        self.mask = torch.ones_like(self.ids)
        self.mask[1, :2] = 0
        self.kw: dict[str, Any] = dict(max_new_tokens=24, do_sample=False, cache_implementation="static")
        self.reads = 0
        decode._decoders.clear()
        env = mock.patch.dict(os.environ, {"CHIDORI_DECODE_REPLAY": "eager"})
        env.start()
        self.addCleanup(env.stop)

    def simulated(self) -> list[Any]:
        """Patches that make `_run(..., "server")` run its loop here, and count host reads."""
        decode, torch = self.decode, self.torch
        original_cpu = torch.Tensor.cpu

        def counting_cpu(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            return original_cpu(tensor, *args, **kwargs)

        def capture(decoder: Any) -> None:
            decoder.decode_step()
            decoder.graph, decoder.exec_handle = object(), 1

        def loop(exec_handle: int, stream: int, max_steps: int, check_every: int, stop_flag: int, output: int,
                 bytes_per_step: int, progress_ms: int,
                 on_output: Optional[Callable[[bytes], None]] = None, tail: bool = False,
                 on_started: Optional[Callable[[], None]] = None,
                 then_copy: Optional[tuple[int, int, int]] = None) -> Any:
            decoder = next(d for d in decode._decoders.values()
                           if 0 <= output - d.rows.data_ptr() < d.rows.numel() * d.rows.element_size())
            if on_started is not None:
                on_started()
            first = (output - decoder.rows.data_ptr()) // bytes_per_step
            send = (lambda slot: on_output(original_cpu(decoder.rows[first + slot]).numpy().tobytes())
                    if on_output is not None else None)
            def closing_copy() -> None:
                if then_copy is not None:
                    ctypes.memmove(then_copy[0], then_copy[1], then_copy[2])

            for step in range(max_steps):
                decoder.decode_step()
                send(step)
                if stop_flag and (step + 1) % check_every == 0 and int(decoder.stop.item()):
                    closing_copy()
                    return decode.LoopResult(step + 1, step + 1, 0)
            if tail:
                send(max_steps)
            closing_copy()
            return decode.LoopResult(max_steps, 0, 0)

        stream = mock.Mock(cuda_stream=0)
        return [mock.patch.object(torch.Tensor, "cpu", counting_cpu),
                mock.patch.object(decode._Decoder, "capture", capture),
                mock.patch.object(decode, "run_loop", loop),
                mock.patch.object(torch.cuda, "current_stream", lambda *a, **k: stream)]

    def fast(self, ids: Any, **kwargs: Any) -> Any:
        self.reads = 0
        patches = self.simulated()
        for p in patches:
            p.start()
        try:
            plan = self.decode._plan(self.model, (ids,), kwargs)
            return self.decode._run(self.model, plan, "server")
        finally:
            for p in reversed(patches):
                p.stop()

    def test_eager_replay_gives_native_tokens(self) -> None:
        native = self.model.generate(self.ids, attention_mask=self.mask, **self.kw)
        fast = self.decode.fast_generate(self.model, self.ids, attention_mask=self.mask, **self.kw)
        self.assertTrue(self.torch.equal(native, fast))

    def test_a_simulated_server_loop_gives_native_tokens(self) -> None:
        native = self.model.generate(self.ids, attention_mask=self.mask, **self.kw)
        for run, reads in (("capture", 2), ("cached", 1)):
            self.assertTrue(self.torch.equal(native, self.fast(self.ids, attention_mask=self.mask, **self.kw)), run)
            # The prompt and its mask in one read; the rows came back with the loop (its tail
            # is the last), except after a capture, whose first row was made before the loop.
            self.assertEqual(self.reads, reads, run)
        heard, native_heard = Recorder(), Recorder()
        self.model.generate(self.ids[:1], attention_mask=self.mask[:1], streamer=native_heard, **self.kw)
        self.fast(self.ids[:1], attention_mask=self.mask[:1], streamer=heard, **self.kw)
        self.assertEqual(heard.got, native_heard.got)

    def test_without_a_mask_or_a_pad_token_nothing_of_the_prompt_is_read(self) -> None:
        self.model.generation_config.pad_token_id = None
        one = self.ids[:1]
        native = self.model.generate(one, **self.kw)
        for run, reads in (("capture", 1), ("cached", 0)):
            self.assertTrue(self.torch.equal(native, self.fast(one, **self.kw)), run)
            # Unpadded for certain: the prefill is told so, and reads nothing to find out.
            self.assertEqual(self.reads, reads, run)
        heard, native_heard = Recorder(), Recorder()
        self.model.generate(one, streamer=native_heard, **self.kw)
        self.fast(one, streamer=heard, **self.kw)
        self.assertEqual(heard.got, native_heard.got)

    def test_rows_streamed_back_are_not_read_again_once_every_sequence_ended(self) -> None:
        one, mask = self.ids[:1], self.mask[:1]
        probe = self.model.generate(one, attention_mask=mask, **self.kw)
        self.model.generation_config.eos_token_id = int(probe[0, 7 + 9])
        native = self.model.generate(one, attention_mask=mask, **self.kw)
        self.assertLess(native.shape[1], probe.shape[1], "ends at EOS")
        self.assertTrue(self.torch.equal(native, self.fast(one, attention_mask=mask, **self.kw)))
        self.assertTrue(self.torch.equal(native, self.fast(one, attention_mask=mask, **self.kw)))
        self.assertEqual(self.reads, 1, "only the prompt: the rows came back with the loop")
        heard, native_heard = Recorder(), Recorder()
        self.model.generate(one, attention_mask=mask, streamer=native_heard, **self.kw)
        self.fast(one, attention_mask=mask, streamer=heard, **self.kw)
        self.assertEqual(heard.got, native_heard.got)


if __name__ == "__main__":
    unittest.main()
