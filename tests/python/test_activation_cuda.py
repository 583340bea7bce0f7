"""The activation ops' CUDA path against fp64 math on fresh random inputs, output memory
poisoned first: the issue's grid of tokens x widths in bf16, every dtype on a subset, odd
widths, every input form and gate broadcast, layouts, streams, graphs, compile and tuning."""

import pytest
import torch

import kiln
from activation_reference import (bias_gelu_fp64, fresh, gated_residual_fp64, geglu_fp64,
                                  swiglu_fp64)
from gpu_memory import gpu_memory_to_itself
from reference import assert_close_to

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GRID_TOKENS = [1, 128, 4096]
GRID_WIDTHS = [8192, 8960, 11008, 12288, 13824, 14336, 18944, 28672]
ODD_WIDTHS = [1, 5, 33, 4545]


def poison_allocator(shape, dtype):
    """Leaves NaN in the caching allocator's free block the op's output will reuse, so an
    element the kernel fails to write shows up as NaN."""
    junk = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del junk


def run_case(form, tokens, width, dtype, gen):
    """One call of one op form; returns (output, fp64 reference)."""
    def r(*shape, scale=2.0):
        return fresh(shape, dtype, device="cuda", scale=scale, generator=gen)

    out_shape = (tokens, width)
    if form == "swiglu":
        gate, up = r(tokens, width), r(tokens, width)
        poison_allocator(out_shape, dtype)
        return kiln.swiglu(gate, up), swiglu_fp64(gate, up)
    if form == "swiglu packed":
        packed = r(tokens, 2 * width)
        poison_allocator(out_shape, dtype)
        return kiln.swiglu(packed), swiglu_fp64(packed)
    if form == "swiglu packed up_first":
        packed = r(tokens, 2 * width)
        poison_allocator(out_shape, dtype)
        return kiln.swiglu(packed, up_first=True), swiglu_fp64(packed, up_first=True)
    if form.startswith("geglu"):
        approximate = "none" if "erf" in form else "tanh"
        if "packed" in form:
            gate, up = r(tokens, 2 * width), None
        else:
            gate, up = r(tokens, width), r(tokens, width)
        poison_allocator(out_shape, dtype)
        return (kiln.geglu(gate, up, approximate=approximate),
                geglu_fp64(gate, up, approximate))
    if form.startswith("gelu"):
        approximate = "none" if "erf" in form else "tanh"
        x = r(tokens, width)
        bias = r(width, scale=0.5) if "bias" in form else None
        poison_allocator(out_shape, dtype)
        return kiln.gelu(x, bias, approximate=approximate), bias_gelu_fp64(x, bias, approximate)
    # gated_residual: h as [B, T, D] with 2 samples where the tokens split evenly
    batch = 2 if tokens % 2 == 0 else 1
    shape = (batch, tokens // batch, width)
    h, y = r(*shape), r(*shape)
    gate = r(batch, 1, width, scale=0.5) if "sample" in form else r(*shape, scale=0.5)
    ref = gated_residual_fp64(h, y, gate)
    if "in place" in form:
        kiln.gated_residual_(h, y, gate)
        return h, ref
    poison_allocator(shape, dtype)
    return kiln.gated_residual(h, y, gate), ref


FORMS = ["swiglu", "swiglu packed", "swiglu packed up_first", "geglu", "geglu erf packed",
         "gelu", "gelu erf bias", "gated_residual", "gated_residual sample",
         "gated_residual sample in place"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("width", GRID_WIDTHS)
def test_grid_bf16(form, width):
    gen = torch.Generator(device="cuda").manual_seed(width)
    for tokens in GRID_TOKENS:
        out, ref = run_case(form, tokens, width, torch.bfloat16, gen)
        assert out.dtype == torch.bfloat16
        assert_close_to(out.reshape(ref.shape), ref, torch.bfloat16)


@pytest.mark.parametrize("form", ["swiglu", "swiglu packed", "gelu erf bias", "gated_residual sample"])
@pytest.mark.parametrize("width", [8192, 28672])
def test_grid_16384_tokens(form, width):
    gen = torch.Generator(device="cuda").manual_seed(7)
    out, ref = run_case(form, 16384, width, torch.bfloat16, gen)
    assert_close_to(out.reshape(ref.shape), ref, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("form", FORMS)
def test_other_dtypes(dtype, form):
    gen = torch.Generator(device="cuda").manual_seed(3)
    for width in (8960, 14336):
        for tokens in (1, 7, 128):
            out, ref = run_case(form, tokens, width, dtype, gen)
            assert out.dtype == dtype
            assert_close_to(out.reshape(ref.shape), ref, dtype)


@pytest.mark.parametrize("width", ODD_WIDTHS)
@pytest.mark.parametrize("form", FORMS)
def test_odd_widths(width, form):
    gen = torch.Generator(device="cuda").manual_seed(width)
    for dtype in DTYPES:
        for tokens in (1, 2, 37):
            out, ref = run_case(form, tokens, width, dtype, gen)
            assert_close_to(out.reshape(ref.shape), ref, dtype)


def test_gate_shared_by_all_rows_and_any_leading_shape():
    for gate_shape in [(1, 1, 256), (256,)]:
        h = fresh((3, 4, 256), torch.bfloat16, "cuda")
        y = fresh((3, 4, 256), torch.bfloat16, "cuda")
        gate = fresh(gate_shape, torch.bfloat16, "cuda")
        assert_close_to(kiln.gated_residual(h, y, gate), gated_residual_fp64(h, y, gate), torch.bfloat16)
    x = fresh((2, 3, 5, 512), torch.bfloat16, "cuda")
    assert_close_to(kiln.swiglu(x), swiglu_fp64(x), torch.bfloat16)


def test_non_contiguous_and_unaligned_inputs():
    base = fresh((64, 520), torch.bfloat16, "cuda")
    odd = base[:, 1:257]  # 2-byte aligned rows, 520 apart
    other = fresh((64, 256), torch.bfloat16, "cuda")
    assert_close_to(kiln.swiglu(odd, other), swiglu_fp64(odd, other), torch.bfloat16)
    assert_close_to(kiln.gelu(odd), bias_gelu_fp64(odd), torch.bfloat16)
    t = fresh((8, 6, 512), torch.float16, "cuda").transpose(0, 1)
    assert_close_to(kiln.geglu(t, approximate="none"), geglu_fp64(t, None, "none"), torch.float16)
    h = fresh((2, 8, 512), torch.bfloat16, "cuda")[:, :, :256]  # padded rows, written in place
    y = fresh((2, 8, 256), torch.bfloat16, "cuda")
    gate = fresh((2, 1, 256), torch.bfloat16, "cuda")
    ref = gated_residual_fp64(h, y, gate)
    kiln.gated_residual_(h, y, gate)
    assert_close_to(h, ref, torch.bfloat16)
    h = fresh((8, 2, 256), torch.bfloat16, "cuda").transpose(0, 1)  # rows do not collapse
    ref = gated_residual_fp64(h, h * 0.5, h * 0.25)
    kiln.gated_residual_(h, h * 0.5, h * 0.25)
    assert_close_to(h, ref, torch.bfloat16)


def test_zero_rows():
    assert kiln.swiglu(torch.randn(0, 64, device="cuda")).shape == (0, 32)
    assert kiln.gelu(torch.randn(0, 64, device="cuda")).is_cuda


def test_mismatched_devices():
    with pytest.raises(ValueError, match=r"kiln.swiglu: up: expected device cpu \(as gate\), got cuda:0"):
        kiln.swiglu(torch.randn(2, 8), torch.randn(2, 8, device="cuda"))
    with pytest.raises(ValueError, match=r"kiln.swiglu: up: expected device cuda:0 \(as gate\), got cpu"):
        kiln.swiglu(torch.randn(2, 8, device="cuda"), torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"kiln.gelu: bias: expected device cuda:0 \(as x\), got cpu"):
        kiln.gelu(torch.randn(2, 8, device="cuda"), torch.randn(8))
    with pytest.raises(ValueError, match=r"kiln.gated_residual: gate: expected device cuda:0 \(as h\), got cpu"):
        kiln.gated_residual(torch.randn(2, 8, device="cuda"), torch.randn(2, 8, device="cuda"),
                            torch.randn(2, 8))


def test_current_stream_and_graph_capture():
    x = fresh((4096, 2 * 4096), torch.bfloat16, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = kiln.swiglu(x)
    side.synchronize()
    assert_close_to(out, swiglu_fp64(x), torch.bfloat16)

    h = fresh((2, 256, 2048), torch.bfloat16, "cuda")
    y = fresh((2, 256, 2048), torch.bfloat16, "cuda")
    gate = fresh((2, 1, 2048), torch.bfloat16, "cuda")
    kiln.gated_residual(h, y, gate)  # resolve outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        captured = kiln.gated_residual(h, y, gate)
    y.copy_(fresh(y.shape, torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to(captured, gated_residual_fp64(h, y, gate), torch.bfloat16)


def test_compile_fullgraph_cuda():
    def block(h, x, gate):
        return kiln.gated_residual(h, kiln.gelu(x + 1, approximate="tanh"), gate)

    compiled = torch.compile(block, fullgraph=True)
    for tokens in (8, 24):
        h = fresh((2, tokens, 1024), torch.bfloat16, "cuda")
        x = fresh((2, tokens, 1024), torch.bfloat16, "cuda")
        gate = fresh((2, 1, 1024), torch.bfloat16, "cuda")
        # The gelu output is a bf16 tensor between the two ops: the reference rounds it too.
        ref = gated_residual_fp64(h, bias_gelu_fp64((x + 1)).to(torch.bfloat16), gate)
        assert_close_to(compiled(h, x, gate), ref, torch.bfloat16)


def test_tuned_kernels_are_correct(tmp_path):
    """With tuning on, the winners compute the same function, for every row bucket."""
    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path), tune="fast")
    try:
        gen = torch.Generator(device="cuda").manual_seed(11)
        for form in ("swiglu", "swiglu packed", "geglu erf packed", "gelu erf bias",
                     "gated_residual sample in place"):
            for tokens, width in ((1, 14336), (128, 8960), (4096, 4545)):
                out, ref = run_case(form, tokens, width, torch.bfloat16, gen)
                assert_close_to(out.reshape(ref.shape), ref, torch.bfloat16)
        assert list(tmp_path.rglob("*.json")), "tuning results were not stored"
    finally:
        kiln.configure(cache_dir=before["cache_dir"], tune=before["tune_mode"])


def test_tuner_times_the_gate_the_call_reads(tmp_path):
    """A gate shared by every row ([1, 1, D] of one sample, or [D]) is tuned as its own
    problem, on one gate row, and a gate per sample on one row a sample: the tuner's traffic
    is the call's (a per-token gate would add a fourth stream as large as h)."""
    import json

    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path), tune="fast")
    try:
        tokens, width = 1000, 3072
        cases = {  # gate shape -> (h's shape, problem flags, gate rows the tuner reads)
            (1, 1, width): ((1, tokens, width), 64, 1),
            (width,): ((tokens, width), 64, 1),
            (2, 1, width): ((2, tokens // 2, width), 8, 4),  # 256 rows a sample
            (1, tokens, width): ((1, tokens, width), 1, tokens),  # contiguous: one flat pass
        }
        for gate_shape, (shape, flags, gate_rows) in cases.items():
            h, y = fresh(shape, torch.bfloat16, "cuda"), fresh(shape, torch.bfloat16, "cuda")
            gate = fresh(gate_shape, torch.bfloat16, "cuda")
            poison_allocator(shape, torch.bfloat16)
            assert_close_to(kiln.gated_residual(h, y, gate), gated_residual_fp64(h, y, gate),
                            torch.bfloat16)
            results = [r for d in json.loads(kiln.report("json"))["devices"]
                       for r in d["results"] if r["op"] == "gated_residual"]
            (result,) = [r for r in results if r["problem"]["flags"] == flags]
            assert result["bytes_moved"] == (3 * tokens + gate_rows) * width * 2, gate_shape
    finally:
        kiln.configure(cache_dir=before["cache_dir"], tune=before["tune_mode"])


@pytest.fixture
def gpu_memory_alone():
    with gpu_memory_to_itself():
        yield


@pytest.mark.parametrize("side", ["below", "above"])
@pytest.mark.parametrize("form", ["gelu erf bias", "gated_residual sample"])
def test_indices_near_and_past_32_bits(form, side, gpu_memory_alone):
    """A call's kernel indexes its vectors in 32 bits up to just below 2^31 elements and in 64
    bits beyond (ElementwiseFamily::needs_index64). An odd width gives rows of 2-byte vectors,
    one element each, so the indices reach their highest: one call on each side of the line."""
    width = 4545
    elements = 2 ** 31 - 2 ** 26 if side == "below" else 2 ** 31 + 2 ** 22
    operands = 2 if form.startswith("gelu") else 3
    needed = (operands + 1) * elements * 2 + elements * 4  # bf16 tensors, fresh()'s fp32 one
    if torch.cuda.mem_get_info()[0] < needed * 1.25:
        pytest.skip(f"needs {needed * 1.25 / 2 ** 30:.0f} GiB of free GPU memory")
    gen = torch.Generator(device="cuda").manual_seed(31)
    if form.startswith("gelu"):
        rows = elements // width
        x = fresh((rows, width), torch.bfloat16, "cuda", generator=gen)
        bias = fresh((width,), torch.bfloat16, "cuda", scale=0.5, generator=gen)
        poison_allocator((rows, width), torch.bfloat16)
        out = kiln.gelu(x, bias, approximate="none")
        reference = lambda r: bias_gelu_fp64(x[r], bias, "none")
        flat_out, sample_edge = out, []
    else:
        tokens = elements // (2 * width)
        rows = 2 * tokens
        h = fresh((2, tokens, width), torch.bfloat16, "cuda", generator=gen)
        y = fresh((2, tokens, width), torch.bfloat16, "cuda", generator=gen)
        gate = fresh((2, 1, width), torch.bfloat16, "cuda", scale=0.5, generator=gen)
        poison_allocator(h.shape, torch.bfloat16)
        out = kiln.gated_residual(h, y, gate)
        flat = lambda t: t.reshape(rows, width)
        reference = lambda r: gated_residual_fp64(flat(h)[r], flat(y)[r], gate[r // tokens, 0])
        flat_out, sample_edge = flat(out), [tokens - 1, tokens]  # the gate changes there
    assert not torch.isnan(out).any(), "an element was not written"
    # Above the line, also the rows around element 2^31 (a signed 32-bit index's wrap).
    wrap = [2 ** 31 // width + d for d in (-1, 0, 1)] if side == "above" else []
    for r in [0, 1, *sample_edge, rows // 2, *wrap, rows - 2, rows - 1]:
        assert_close_to(flat_out[r], reference(r), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,width,lead", [(1, 12288, 3072), (4608, 12288, 3072), (7, 4545, 33),
                                               (128, 5, 3)])
@pytest.mark.parametrize("bias", [False, True])
def test_gelu_out_writes_a_slice_of_a_wider_buffer(dtype, tokens, width, lead, bias):
    """FLUX's single blocks: the activation written into the columns after `lead` of a
    poisoned [B, S, lead + width] buffer, rows `lead + width` apart; the columns before stay
    as they were."""
    gen = torch.Generator(device="cuda").manual_seed(tokens + width)
    x = fresh((2, tokens, width), dtype, device="cuda", generator=gen)
    b = fresh((width,), dtype, device="cuda", scale=0.5, generator=gen) if bias else None
    buffer = torch.full((2, tokens, lead + width), float("nan"), dtype=dtype, device="cuda")
    kiln.gelu(x, b, out=buffer[..., lead:])  # the kernel loaded and tuned before memory is watched
    buffer[..., lead:] = float("nan")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    assert kiln.gelu(x, b, out=buffer[..., lead:]).data_ptr() == buffer[..., lead:].data_ptr()
    # Written in place: no result of x's size made beside the buffer and copied in.
    assert torch.cuda.max_memory_allocated() - before < x.nbytes
    assert_close_to(buffer[..., lead:], bias_gelu_fp64(x, b, "tanh"), dtype)
    assert buffer[..., :lead].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,width,lead", [(1, 12288, 3072), (4608, 12288, 3072), (7, 4545, 33), (128, 5, 3)])
@pytest.mark.parametrize("packed", [False, True])
def test_swiglu_out_writes_a_slice_of_a_wider_buffer(dtype, tokens, width, lead, packed):
    """Ovis-Image's single blocks: silu(gate) * up written into the columns after `lead` of a
    poisoned [B, S, lead + width] buffer, from one packed [B, S, 2 * width] projection (up
    first, as Ovis-Image splits it) or two tensors; the columns before stay as they were."""
    gen = torch.Generator(device="cuda").manual_seed(tokens + width)
    if packed:
        inputs = (fresh((2, tokens, 2 * width), dtype, device="cuda", generator=gen), None, True)
    else:
        inputs = tuple(fresh((2, tokens, width), dtype, device="cuda", generator=gen) for _ in range(2)) + (False,)
    buffer = torch.full((2, tokens, lead + width), float("nan"), dtype=dtype, device="cuda")
    kiln.swiglu(*inputs, out=buffer[..., lead:])  # the kernel loaded and tuned before memory is watched
    buffer[..., lead:] = float("nan")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    assert kiln.swiglu(*inputs, out=buffer[..., lead:]).data_ptr() == buffer[..., lead:].data_ptr()
    # Written in place: no result made beside the buffer and copied in.
    assert torch.cuda.max_memory_allocated() - before < buffer[..., lead:].nbytes
    assert_close_to(buffer[..., lead:], swiglu_fp64(*inputs), dtype)
    assert buffer[..., :lead].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_out_over_its_own_input_and_across_rows_that_do_not_collapse(dtype):
    """An `out` that is x itself, or whose rows do not share one stride (a transposed view:
    gelu's and swiglu's), is computed beside it and copied in: the same values either way."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = fresh((64, 96), dtype, device="cuda", generator=gen)
    expected = bias_gelu_fp64(x, None, "none")
    kiln.gelu(x, approximate="none", out=x)
    assert_close_to(x, expected, dtype)
    y = fresh((3, 40, 96), dtype, device="cuda", generator=gen)
    target = torch.full((40, 3, 96), float("nan"), dtype=dtype, device="cuda").transpose(0, 1)
    kiln.gelu(y, out=target)
    assert_close_to(target, bias_gelu_fp64(y, None, "tanh"), dtype)
    packed = fresh((3, 40, 192), dtype, device="cuda", generator=gen)
    target = torch.full((40, 3, 96), float("nan"), dtype=dtype, device="cuda").transpose(0, 1)
    kiln.swiglu(packed, up_first=True, out=target)
    assert_close_to(target, swiglu_fp64(packed, up_first=True), dtype)
