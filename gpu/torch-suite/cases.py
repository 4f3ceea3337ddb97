"""PyTorch cases whose results are compared between a native run and a run through Chidori.

Each case seeds the RNGs, runs on `cuda` and returns a dict of JSON values (tensors reduced
by `stats`). An optional "info" entry holds values that are shown but not compared. The
tolerance a case registers with applies to its floats; ints, bools, strings and shapes are
always compared exactly:
  exact  bit-identical floats (seeded RNG, data-dependent ops)
  fp32   relative 1e-5
  loose  relative 1e-3 (TF32, fp16, bf16, AMP)
"""
import functools
import os
import random
import threading

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DEV = "cuda"
CASES = {}


def case(tol):
    """Register the decorated function in CASES under its name, seeding before each call."""
    def register(fn):
        @functools.wraps(fn)
        def run():
            random.seed(0)
            torch.manual_seed(0)
            return fn()
        run.tol = tol
        CASES[fn.__name__] = run
        return run
    return register


def stats(t, k=6):
    """Shape, dtype, float64 sum / abs-sum / abs-max and k evenly spaced elements of a tensor."""
    t = t.detach()
    dtype = str(t.dtype)
    if t.is_complex():
        t = torch.view_as_real(t)
    f = t.double().flatten()
    idx = torch.linspace(0, f.numel() - 1, k, device=f.device).long()
    return {"shape": list(t.shape), "dtype": dtype, "sum": f.sum().item(),
            "abs_sum": f.abs().sum().item(), "abs_max": f.abs().max().item(),
            "sample": f[idx].tolist()}


@case("fp32")
def elementwise_reductions():
    x = torch.randn(1024, 1024, device=DEV)
    y = torch.rand(1024, 1024, device=DEV) + 0.5
    i = torch.randint(-1000, 1000, (1 << 20,), device=DEV)
    chain = torch.sigmoid(x * y + x / y - y.log() + x.clamp(max=3).exp() + x.sin() * y.tanh()) ** 2
    return {
        "chain": stats(chain),
        "sum": x.sum().item(), "mean": x.mean().item(), "std": x.std().item(),
        "max": x.max().item(), "argmax": x.argmax().item(), "argmin": x.argmin().item(),
        "norm": torch.linalg.vector_norm(x).item(),
        "row_var": stats(x.var(dim=1)), "col_prod": stats(y[:8].prod(dim=0)),
        "cumsum": stats(x.cumsum(dim=1)), "softmax": stats(x.softmax(dim=-1)),
        "logsumexp": stats(x.logsumexp(dim=-1)),
        "sort": stats(x.sort(dim=1).values), "topk": stats(x.topk(5, dim=1).values),
        "int_ops": [(i % 7).sum().item(), (i ^ 0x55).sum().item(), (i // 3).max().item(),
                    (i > 0).sum().item()],
    }


def matmul_results(dtype):
    a = torch.randn(512, 768, device=DEV, dtype=dtype)
    b = torch.randn(768, 384, device=DEV, dtype=dtype)
    bias = torch.randn(384, device=DEV, dtype=dtype)
    mm = a @ b
    ref = a.double() @ b.double()
    return {
        "mm": stats(mm),
        "mm_transposed": stats(b.t() @ a.t()),
        "addmm": stats(torch.addmm(bias, a, b)),
        "bmm": stats(torch.bmm(torch.randn(8, 128, 64, device=DEV, dtype=dtype),
                               torch.randn(8, 64, 96, device=DEV, dtype=dtype))),
        # Differs by orders of magnitude between precisions: catches a math mode not honoured.
        "rel_err_vs_fp64": ((mm.double() - ref).abs().max() / ref.abs().max()).item(),
    }


@case("fp32")
def matmul_fp32():
    return matmul_results(torch.float32)


@case("loose")
def matmul_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return matmul_results(torch.float32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@case("loose")
def matmul_fp16():
    return matmul_results(torch.float16)


@case("loose")
def matmul_bf16():
    return matmul_results(torch.bfloat16)


@case("loose")
def conv_cudnn():
    x = torch.randn(8, 16, 32, 32, device=DEV, requires_grad=True)
    w = torch.randn(32, 16, 3, 3, device=DEV, requires_grad=True)
    y = F.conv2d(x, w, padding=1)
    y.square().mean().backward()
    xd, wd = x.detach(), w.detach()
    nhwc = xd.half().to(memory_format=torch.channels_last)
    return {
        "conv2d": stats(y), "grad_input": stats(x.grad), "grad_weight": stats(w.grad),
        "fp16_channels_last": stats(F.conv2d(nhwc, wd.half().to(memory_format=torch.channels_last),
                                             padding=1)),
        "strided_dilated": stats(F.conv2d(xd, wd, stride=2, dilation=2, padding=2)),
        "depthwise": stats(F.conv2d(xd, torch.randn(16, 1, 5, 5, device=DEV), groups=16, padding=2)),
        "transposed": stats(F.conv_transpose2d(xd, torch.randn(16, 8, 4, 4, device=DEV), stride=2,
                                               padding=1)),
        "conv1d": stats(F.conv1d(torch.randn(4, 8, 100, device=DEV),
                                 torch.randn(16, 8, 5, device=DEV))),
        "conv3d": stats(F.conv3d(torch.randn(2, 4, 8, 16, 16, device=DEV),
                                 torch.randn(8, 4, 3, 3, 3, device=DEV), padding=1)),
    }


@case("fp32")
def cnn_training():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 3, 32, 32, device=DEV)
    y = torch.randint(0, 10, (32,), device=DEV)
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "conv1_weight": stats(model[0].weight),
            "bn1_running_mean": stats(model[1].running_mean), "fc_weight": stats(model[-1].weight)}


@case("fp32")
def lstm():
    net = nn.LSTM(32, 64, num_layers=2, batch_first=True).to(DEV)
    x = torch.randn(8, 50, 32, device=DEV, requires_grad=True)
    out, (h, c) = net(x)
    (out.square().mean() + h.sum()).backward()
    return {"out": stats(out), "h": stats(h), "c": stats(c), "grad_input": stats(x.grad),
            "grad_weight_hh_l0": stats(net.weight_hh_l0.grad)}


@case("loose")
def sdpa_backends():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(2, 8, 256, 64, device=DEV, dtype=torch.float16) for _ in range(3))
    weight = torch.randn(2, 8, 256, 64, device=DEV)
    result, info = {}, {}
    for backend in (SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
                (out.float() * weight).sum().backward()
        except RuntimeError as e:
            result[backend.name] = "unsupported"
            info[backend.name] = str(e).strip().splitlines()[0]
            continue
        result[backend.name] = {"out": stats(out), "grad_q": stats(qg.grad), "grad_v": stats(vg.grad)}
    return {**result, "info": info}


@case("loose")
def amp_training():
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.LayerNorm(512), nn.Linear(512, 10)).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(64, 256, device=DEV)
    y = torch.randint(0, 10, (64,), device=DEV)
    losses = []
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        bf16_logits = model(x)
    return {"losses": losses, "logits_dtype": str(logits.dtype), "loss_dtype": str(loss.dtype),
            "scale": scaler.get_scale(), "weight": stats(model[0].weight),
            "bf16_logits": stats(bf16_logits)}


@case("fp32")
def cuda_graph():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    static_x = torch.randn(32, 64, device=DEV)
    static_y = torch.randint(0, 10, (32,), device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as capture requires
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    step = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(step):
        static_loss = F.cross_entropy(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    losses = []
    for _ in range(5):
        static_x.copy_(torch.randn(32, 64, device=DEV))
        static_y.copy_(torch.randint(0, 10, (32,), device=DEV))
        step.replay()
        losses.append(static_loss.item())
    forward = torch.cuda.CUDAGraph()
    with torch.no_grad():
        with torch.cuda.graph(forward):
            static_out = model(static_x)
        static_x.copy_(torch.randn(32, 64, device=DEV))
        forward.replay()
        eager = model(static_x)
    return {"losses": losses, "weight": stats(model[0].weight), "forward": stats(static_out),
            "forward_close_to_eager": torch.allclose(static_out, eager, rtol=1e-5, atol=1e-6)}


@case("fp32")
def pinned_dataloader():
    data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
    loader = DataLoader(data, batch_size=256, shuffle=True, pin_memory=True, num_workers=0,
                        generator=torch.Generator().manual_seed(0))
    model = nn.Linear(64, 10).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pinned, losses = [], []
    for xb, yb in loader:
        pinned.append(xb.is_pinned() and yb.is_pinned())
        xb, yb = xb.to(DEV, non_blocking=True), yb.to(DEV, non_blocking=True)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    host = torch.empty(10, 64, pin_memory=True)
    host.copy_(model.weight.detach(), non_blocking=True)
    torch.cuda.current_stream().synchronize()
    return {"batches_pinned": pinned, "losses": torch.stack(losses).tolist(),
            "weight_to_pinned_host": stats(host)}


@case("fp32")
def streams_events():
    main = torch.cuda.current_stream()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream(priority=-1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    x = torch.randn(1024, 1024, device=DEV)
    start.record()
    producer.wait_stream(main)
    with torch.cuda.stream(producer):
        a = x @ x
        produced = producer.record_event()
    with torch.cuda.stream(consumer):
        consumer.wait_event(produced)
        b = torch.relu(a) + 1
        a.record_stream(consumer)  # a is freed below while consumer may still read it
        consumed = consumer.record_event()
    del a
    main.wait_event(consumed)
    b.record_stream(main)
    total = b.sum()
    end.record()
    end.synchronize()
    return {"b": stats(b), "total": total.item(),
            "idle": [producer.query(), consumer.query(), produced.query(), consumed.query()],
            "info": {"elapsed_ms": start.elapsed_time(end)}}


@case("fp32")
def two_threads():
    out = {}

    def work(i):
        try:
            gen = torch.Generator(device=DEV).manual_seed(i)
            stream = torch.cuda.Stream() if i else torch.cuda.default_stream()
            with torch.cuda.stream(stream):
                x = torch.randn(512, 512, device=DEV, generator=gen)
                for _ in range(20):
                    x = torch.tanh(x @ x / 22.6)
                out[f"thread{i}"] = stats(x)
        except Exception as e:  # re-raised in the main thread
            out[f"thread{i}"] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for value in out.values():
        if isinstance(value, Exception):
            raise value
    return dict(sorted(out.items()))


@case("fp32")
def torch_compile():
    def f(x, y):
        return (F.gelu(x @ y + 1.0).softmax(dim=-1) + torch.sin(x) * 0.5).sum(dim=0) * x.abs().mean()

    compiled = torch.compile(f, fullgraph=True)
    x = torch.randn(256, 256, device=DEV)
    y = torch.randn(256, 256, device=DEV)
    out = compiled(x, y)
    again = compiled(x * 2, y)
    return {"out": stats(out), "again": stats(again),
            "close_to_eager": torch.allclose(out, f(x, y), rtol=1e-4, atol=1e-5)}


@case("fp32")
def nvrtc_jiterator():
    # torch's jiterator compiles the kernel at run time through NVRTC and loads the CUBIN.
    code = "template <typename T> T chidori_op(T x, T y, T alpha) { return -x * y + x - y + alpha; }"
    fn = torch.cuda.jiterator._create_jit_fn(code, alpha=1.0)
    a = torch.rand(3, 1000, device=DEV)
    b = torch.rand(3, 1000, device=DEV)
    out = fn(a, b, alpha=3.14)
    return {"out": stats(out), "matches_eager": torch.allclose(out, -a * b + a - b + 3.14)}


@case("fp32")
def fft():
    x = torch.randn(64, 1024, device=DEV)
    c = torch.fft.fft(x)
    return {
        "fft": stats(c), "rfft": stats(torch.fft.rfft(x)), "ifft": stats(torch.fft.ifft(c)),
        "rfft_n1000": stats(torch.fft.rfft(x[:, :1000])),
        "fft2": stats(torch.fft.fft2(torch.randn(128, 128, device=DEV))),
        "roundtrip_ok": torch.allclose(torch.fft.irfft(torch.fft.rfft(x), n=1024), x, atol=1e-5),
    }


@case("fp32")
def linalg():
    n = 256
    eye = torch.eye(n, device=DEV)
    a = torch.randn(n, n, device=DEV) / n ** 0.5 + 2 * eye
    m = torch.randn(n, n, device=DEV)
    spd = m @ m.T / n + eye
    b = torch.randn(n, 8, device=DEV)
    x = torch.linalg.solve(a, b)
    chol = torch.linalg.cholesky(spd)
    u, s, vh = torch.linalg.svd(m)
    w, v = torch.linalg.eigh(spd)
    q, r = torch.linalg.qr(a)
    inv = torch.linalg.inv(a)
    return {
        "solve": stats(x), "cholesky": stats(chol), "singular_values": stats(s),
        "eigenvalues": stats(w), "qr_abs_diag": stats(r.diagonal().abs()), "inv": stats(inv),
        "logabsdet": torch.linalg.slogdet(a).logabsdet.item(),
        "checks_ok": [torch.allclose(a @ x, b, atol=1e-4), torch.allclose(chol @ chol.T, spd, atol=1e-4),
                      torch.allclose(u * s @ vh, m, atol=1e-3), torch.allclose(v * w @ v.T, spd, atol=1e-4),
                      torch.allclose(q @ r, a, atol=1e-4), torch.allclose(a @ inv, eye, atol=1e-4)],
    }


@case("fp32")
def sparse_matmul():
    rows, cols, k = 256, 512, 4000
    idx = torch.stack([torch.randint(0, rows, (k,)), torch.randint(0, cols, (k,))]).to(DEV)
    coo = torch.sparse_coo_tensor(idx, torch.randn(k, device=DEV), (rows, cols)).coalesce()
    csr = coo.to_sparse_csr()
    dense = torch.randn(cols, 64, device=DEV)
    ref = coo.to_dense() @ dense
    coo_out = torch.sparse.mm(coo, dense)
    csr_out = csr @ dense
    return {
        "nnz": coo._nnz(), "crow_head": csr.crow_indices()[:8].tolist(),
        "coo_mm": stats(coo_out), "csr_mm": stats(csr_out),
        "csr_mv": stats(csr @ torch.randn(cols, device=DEV)),
        "close_to_dense": [torch.allclose(coo_out, ref, atol=1e-4), torch.allclose(csr_out, ref, atol=1e-4)],
    }


@case("exact")
def data_dependent():
    x = torch.randint(-50, 50, (1000, 100), device=DEV)
    f = torch.randn(1000, 100, device=DEV)
    nz = torch.nonzero(x > 45)
    sevens = x[x % 7 == 0]
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    clipped = x.clone()
    clipped[clipped < 0] = 0
    return {
        "nonzero_shape": list(nz.shape), "nonzero_head": nz[:4].tolist(), "nonzero_sum": nz.sum().item(),
        "mask_index": [sevens.numel(), sevens.sum().item()],
        "mask_float_sum": f[f > 1].sum().item(), "mask_assign_sum": clipped.sum().item(),
        "unique": [values.numel(), values.sum().item(), inverse.sum().item()], "counts": counts.tolist(),
        "unique_rows": torch.unique(x[:, :2] % 3, dim=0).tolist(),
        "where": torch.where(x > 0, x, -2 * x).sum().item(),
        "where_indices": torch.where(x == 0)[1][:8].tolist(),
        "bincount_head": torch.bincount(x.flatten() + 50)[:10].tolist(),
        "repeat_interleave": torch.repeat_interleave(
            torch.arange(5, device=DEV), torch.tensor([1, 2, 3, 0, 4], device=DEV)).tolist(),
    }


@case("exact")
def rng():
    probs = torch.rand(50, device=DEV)
    state = torch.cuda.get_rng_state()
    first = torch.rand(100, device=DEV)
    torch.cuda.set_rng_state(state)
    return {
        "state_replay_equal": torch.equal(first, torch.rand(100, device=DEV)),
        "rand": stats(torch.rand(10000, device=DEV)),
        "randn": stats(torch.randn(10000, device=DEV)),
        "randn_fp16": stats(torch.randn(1000, device=DEV, dtype=torch.float16)),
        "randint": torch.randint(0, 1000, (16,), device=DEV).tolist(),
        "dropout": stats(F.dropout(torch.ones(10000, device=DEV), p=0.3)),
        "multinomial": torch.multinomial(probs, 20, replacement=True).tolist(),
        "multinomial_no_replacement": torch.multinomial(probs, 10).tolist(),
        "normal": stats(torch.empty(1000, device=DEV).normal_(2.0, 3.0)),
        "bernoulli": stats(torch.bernoulli(torch.full((1000,), 0.3, device=DEV))),
        "randperm_head": torch.randperm(1000, device=DEV)[:10].tolist(),
        "generator": stats(torch.randn(1000, device=DEV,
                                       generator=torch.Generator(device=DEV).manual_seed(7))),
    }


@case("fp32")
def hf_gpt2_training():
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000,
                                       n_positions=128)).to(DEV)
    ids = torch.randint(0, 1000, (4, 64), device=DEV)
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits
    model.train()  # dropout on: uses the CUDA RNG
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(4):
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"logits": stats(logits), "losses": losses, "wte": stats(model.transformer.wte.weight)}


@case("loose")
def hf_llama_bf16_generate():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).to(DEV, dtype=torch.bfloat16).eval()
    ids = torch.randint(3, 1000, (2, 16), device=DEV)
    with torch.no_grad():
        logits = model(ids).logits
        tokens = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
    return {"logits": stats(logits), "generated": tokens[:, ids.shape[1]:].tolist()}


@case("exact")
def memory_apis():
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    x = torch.empty(1000, 1000, device=DEV)
    allocated = torch.cuda.memory_allocated() - base
    y = x * 2
    peak = torch.cuda.max_memory_allocated() - base
    del x, y
    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0)
    return {
        "allocated_delta": allocated, "peak_delta": peak,
        "released": torch.cuda.memory_allocated() == base,
        "capability": list(torch.cuda.get_device_capability(0)),
        "info": {"name": props.name, "total_memory": props.total_memory,
                 "multi_processor_count": props.multi_processor_count,
                 "device_count": torch.cuda.device_count(), "mem_get_info": [free, total],
                 "memory_allocated": torch.cuda.memory_allocated(),
                 "max_memory_allocated": torch.cuda.max_memory_allocated(),
                 "memory_reserved": torch.cuda.memory_reserved()},
    }
