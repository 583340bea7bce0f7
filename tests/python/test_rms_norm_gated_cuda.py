"""kiln.rms_norm_gated's CUDA path against fp64 math on fresh random inputs, with the output
memory poisoned first: every dtype, both gates and both orders, odd and even widths
(Qwen3-Next's 128-wide value heads, the norm grid's widths), 1 row and many, with and without
weight; strided gates; the tuned kernels; CUDA graphs and torch.compile; and a patched
linear-attention model."""

import pytest
import torch

import kiln
from cuda_inputs import poison_allocator, rand
from linear_attention_models import assert_patched_logits_match, tiny_model
from reference import assert_close_to, rms_norm_gated_fp64

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HIDDEN = [7, 128, 256, 1536, 4096, 4545, 8192, 14848]
ROWS = [1, 128, 2688, 8192]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_grid(dtype, hidden):
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    w = rand(hidden, dtype=dtype, gen=gen, offset=1.0, scale=0.3)
    rows_list = ROWS + [131072] if hidden == 128 else ROWS  # 4096 tokens x 32 value heads
    for rows in rows_list:
        x = rand(rows, hidden, dtype=dtype, gen=gen, offset=0.2)
        gate = rand(rows, hidden, dtype=dtype, gen=gen, scale=3.0)
        for weight, activation, first in ((w, "silu", False), (None, "sigmoid", False), (w, "sigmoid", True),
                                          (None, "silu", True)):
            poison_allocator(x.shape, dtype)
            out = kiln.rms_norm_gated(x, gate, weight, 1e-5, activation, not first)
            assert_close_to(out, rms_norm_gated_fp64(x, gate, weight, 1e-5, activation, not first), dtype)


def test_strided_gate_and_rows():
    """Qwen3-Next's z is a slice of its projection; x a [B, T, H, D] view of another."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    dt = torch.bfloat16
    projection = rand(2, 33, 8, 256, dtype=dt, gen=gen)
    x, gate = projection[..., :128], rand(2, 33, 8, 384, dtype=dt, gen=gen)[..., 256:]
    w = rand(128, dtype=dt, gen=gen, offset=1.0)
    poison_allocator((2, 33, 8, 128), dt)
    out = kiln.rms_norm_gated(x, gate, w)
    assert out.is_contiguous()
    assert_close_to(out, rms_norm_gated_fp64(x, gate, w, 1e-6), dt)


def test_tuned_kernels_are_correct(tmp_path):
    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path), tune="fast")
    gen = torch.Generator(device="cuda").manual_seed(6)
    try:
        for dtype in DTYPES:
            for hidden, rows in ((128, 131072), (128, 64), (4096, 1), (14848, 128)):
                x, gate = rand(rows, hidden, dtype=dtype, gen=gen), rand(rows, hidden, dtype=dtype, gen=gen)
                w = rand(hidden, dtype=dtype, gen=gen, offset=1.0)
                for norm_before_gate in (True, False):
                    poison_allocator(x.shape, dtype)
                    assert_close_to(kiln.rms_norm_gated(x, gate, w, 1e-6, "silu", norm_before_gate),
                                    rms_norm_gated_fp64(x, gate, w, 1e-6, "silu", norm_before_gate), dtype)
        assert list(tmp_path.rglob("*.json")), "tuning results were not stored"
    finally:
        kiln.configure(cache_dir=before["cache_dir"], tune=before["tune_mode"])


def test_graph_capture_and_compile():
    gen = torch.Generator(device="cuda").manual_seed(7)
    dt = torch.bfloat16
    x, gate = rand(256, 128, dtype=dt, gen=gen), rand(256, 128, dtype=dt, gen=gen)
    w = rand(128, dtype=dt, gen=gen, offset=1.0)
    kiln.rms_norm_gated(x, gate, w)  # resolve outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = kiln.rms_norm_gated(x, gate, w)
    x.copy_(rand(256, 128, dtype=dt, gen=gen))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to(out, rms_norm_gated_fp64(x, gate, w, 1e-6), dt)

    compiled = torch.compile(lambda a, g: kiln.rms_norm_gated(a * 2, g, w, 1e-6, "sigmoid"), fullgraph=True)
    for rows in (8, 24):
        a, g = rand(rows, 128, dtype=dt, gen=gen), rand(rows, 128, dtype=dt, gen=gen)
        assert_close_to(compiled(a, g), rms_norm_gated_fp64(a * 2, g, w, 1e-6, "sigmoid"), dt)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5"])
def test_patched_linear_attention_model_on_cuda(name):
    """A tiny Qwen3-Next / Qwen3.5 text model on the GPU gives the logits of the unpatched model,
    its gated norm replaced. fp32: in bf16 one rounding more or less anywhere (kiln's swiglu
    alone does it) flips Qwen3-Next's top-k expert choices and moves its logits by percents."""
    model = tiny_model(name, hidden=256, head_dim=64, vocab_size=128).to("cuda")
    assert_patched_logits_match(model, torch.randint(0, 128, (2, 16), device="cuda"), gated_norms=1, rtol=1e-4)
