"""The norm ops' CUDA path against fp64 math on fresh random inputs, with the output memory
poisoned first, over the issue's grid of hidden sizes and row counts."""

import contextlib

import pytest
import torch

import kiln
from cuda_inputs import poison_allocator, rand
from gpu_memory import gpu_memory_to_itself
from reference import (
    adaln_fp64,
    assert_close_to,
    fused_add_rms_norm_fp64,
    gated_adaln_fp64,
    layer_norm_fp64,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HIDDEN = [1536, 2048, 2432, 3072, 3584, 4096, 4544, 5120, 8192, 14848]
ROWS = [1, 128, 2688, 8192]


def rows_for(dtype):
    # 32768 rows of 14848 fp32 elements (and their fp64 references) are 6 GB a tensor: the
    # largest row count runs in bf16, the dtype the performance targets are set in.
    return ROWS + [32768] if dtype == torch.bfloat16 else ROWS


@pytest.fixture(autouse=True)
def large_calls_alone(request):
    """The bf16 grid's widest rows reach 32768 rows (rows_for): tens of GiB with their fp64
    references, run one such test at a time (gpu_memory.py)."""
    params = request.node.callspec.params if hasattr(request.node, "callspec") else {}
    large = params.get("dtype") == torch.bfloat16 and params.get("hidden", 0) >= 8192
    with gpu_memory_to_itself() if large else contextlib.nullcontext():
        yield


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_add_rms_norm_grid(dtype, hidden):
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    w = rand(hidden, dtype=dtype, gen=gen, offset=1.0, scale=0.5)
    for rows in rows_for(dtype):
        x, r = rand(rows, hidden, dtype=dtype, gen=gen), rand(rows, hidden, dtype=dtype, gen=gen, offset=0.3)
        poison_allocator(x.shape, dtype)
        out, s = kiln.fused_add_rms_norm(x, r, w, 1e-5)
        ref_out, ref_s = fused_add_rms_norm_fp64(x, r, w, 1e-5)
        assert_close_to(s, ref_s, dtype)
        assert_close_to(out, ref_out, dtype)
        kiln.fused_add_rms_norm_(x, r, w, 1e-5)  # in place: r <- x + r, x <- norm
        # The sum is one rounding either way. The in-place form is a problem of its own,
        # tuned apart, and its config may add a row's squares in another order, so its
        # normalised output is held to the reference, not to the other form's bits.
        assert torch.equal(r, s)
        assert_close_to(x, ref_out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_layer_norm_grid(dtype, hidden):
    gen = torch.Generator(device="cuda").manual_seed(hidden + 1)
    w, b = rand(hidden, dtype=dtype, gen=gen, offset=1.0), rand(hidden, dtype=dtype, gen=gen)
    for rows in rows_for(dtype):
        x = rand(rows, hidden, dtype=dtype, gen=gen, offset=1.5, scale=2.0)
        for weight, bias in ((w, b), (None, None)):
            poison_allocator(x.shape, dtype)
            assert_close_to(kiln.layer_norm(x, weight, bias, 1e-5), layer_norm_fp64(x, weight, bias, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_adaln_grid(dtype, hidden):
    gen = torch.Generator(device="cuda").manual_seed(hidden + 2)
    for rows in rows_for(dtype):
        b = 2 if rows % 2 == 0 else 1
        t = rows // b
        x = rand(b, t, hidden, dtype=dtype, gen=gen, offset=0.5)
        y = rand(b, t, hidden, dtype=dtype, gen=gen)
        # LTX-Video: RMSNorm without weight, per-token operands from the table + temb sum.
        temb = rand(b, t, 6 * hidden, dtype=dtype, gen=gen, scale=0.3)
        table = rand(6, hidden, dtype=dtype, gen=gen, scale=0.3)
        ada = kiln.ada_values(temb, 6)
        poison_allocator(x.shape, dtype)
        out = kiln.adaln(x, ada[:, :, 1], ada[:, :, 0], None, 1e-6, "rms", table[1], table[0])
        assert_close_to(out, adaln_fp64(x, ada[:, :, 1], ada[:, :, 0], None, 1e-6, "rms", table[1], table[0]), dtype)
        h2, out2 = kiln.gated_adaln(x, y, ada[:, :, 2], ada[:, :, 4], ada[:, :, 3], None, 1e-6, "rms", table[2], table[4], table[3])
        ref_h2, ref_out2 = gated_adaln_fp64(x, y, ada[:, :, 2], ada[:, :, 4], ada[:, :, 3], None, 1e-6, "rms", table[2], table[4], table[3])
        assert_close_to(h2, ref_h2, dtype)
        assert_close_to(out2, ref_out2, dtype)
        # LTX-Video's text-to-video call: one timestep per sample, temb [B, 1, 6D] + table.
        temb1 = rand(b, 1, 6 * hidden, dtype=dtype, gen=gen, scale=0.3)
        ada1 = kiln.ada_values(temb1, 6)
        poison_allocator(x.shape, dtype)
        out = kiln.adaln(x, ada1[:, :, 1], ada1[:, :, 0], None, 1e-6, "rms", table[1], table[0])
        assert_close_to(out, adaln_fp64(x, ada1[:, :, 1], ada1[:, :, 0], None, 1e-6, "rms", table[1], table[0]), dtype)
        sample_args = (ada1[:, :, 2], ada1[:, :, 4], ada1[:, :, 3], None, 1e-6, "rms", table[2], table[4], table[3])
        h2, out2 = kiln.gated_adaln(x, y, *sample_args)
        ref_h2, ref_out2 = gated_adaln_fp64(x, y, *sample_args)
        assert_close_to(h2, ref_h2, dtype)
        assert_close_to(out2, ref_out2, dtype)
        # FLUX: LayerNorm without affine, per-sample operands.
        scale, shift, gate = (rand(b, 1, hidden, dtype=dtype, gen=gen, scale=0.5) for _ in range(3))
        poison_allocator(x.shape, dtype)
        out = kiln.adaln(x, scale, shift, None, 1e-6, "layer")
        assert_close_to(out, adaln_fp64(x, scale, shift, None, 1e-6, "layer"), dtype)
        h2, out2 = kiln.gated_adaln(x, y, gate, scale, shift, None, 1e-6, "layer")
        ref_h2, ref_out2 = gated_adaln_fp64(x, y, gate, scale, shift, None, 1e-6, "layer")
        assert_close_to(h2, ref_h2, dtype)
        assert_close_to(out2, ref_out2, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [33, 1536, 4545, 5120])
@pytest.mark.parametrize("per_token", [False, True])
def test_adaln_fp32_table_rows(dtype, hidden, per_token):
    """Wan's seams: temb's rows of x's dtype plus fp32 table rows, added in fp32; LayerNorm;
    rows of 1, 128 and 2688 tokens. One set of rows starts 4 bytes past a 16-byte boundary (a
    slice of a flat buffer), which the op must not read as if aligned."""
    gen = torch.Generator(device="cuda").manual_seed(hidden + per_token)
    flat = torch.randn(7 * hidden + 1, device="cuda", generator=gen) * 0.3
    for table in (flat[: 6 * hidden].view(6, hidden), flat[1: 6 * hidden + 1].view(6, hidden)):
        for t in (1, 128, 2688):
            b = 2
            x = rand(b, t, hidden, dtype=dtype, gen=gen, offset=0.5)
            y = rand(b, t, hidden, dtype=dtype, gen=gen)
            temb = rand(b, t if per_token else 1, 6, hidden, dtype=dtype, gen=gen, scale=0.3)
            shift, scale, gate = temb[:, :, 0], temb[:, :, 1], temb[:, :, 2]
            poison_allocator(x.shape, dtype)
            out = kiln.adaln(x, scale, shift, None, 1e-6, "layer", table[1], table[0])
            assert out.dtype == dtype
            assert_close_to(out, adaln_fp64(x, scale, shift, None, 1e-6, "layer", table[1], table[0]), dtype)
            poison_allocator(x.shape, dtype)
            args = (gate, scale, shift, None, 1e-6, "layer", table[2], table[1], table[0])
            h2, out2 = kiln.gated_adaln(x, y, *args)
            ref_h2, _ = gated_adaln_fp64(x, y, *args)
            assert_close_to(h2, ref_h2, dtype)
            # out normalises h2 as returned (an element of h2 an ulp off the fp64 sum's rounding
            # moves out by that ulp times rstd * (1 + scale)).
            assert_close_to(out2, adaln_fp64(h2, scale, shift, None, 1e-6, "layer", table[1], table[0]), dtype)


def test_adaln_many_samples():
    """A row's sample is a multiply-high by the magic of T: many samples of odd and power-of-two
    token counts, per sample and per token, against fp64."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    dt = torch.bfloat16
    for b, t in ((37, 3), (5, 77), (129, 1), (3, 1024), (2, 2689)):
        x, y = rand(b, t, 256, dtype=dt, gen=gen, offset=0.5), rand(b, t, 256, dtype=dt, gen=gen)
        for rows_of_m in (1, t):
            gate, scale, shift = (rand(b, rows_of_m, 256, dtype=dt, gen=gen, scale=0.5) for _ in range(3))
            poison_allocator(x.shape, dt)
            assert_close_to(kiln.adaln(x, scale, shift), adaln_fp64(x, scale, shift), dt)
            poison_allocator(x.shape, dt)
            h2, out = kiln.gated_adaln(x, y, gate, scale, shift, None, 1e-6, "layer")
            ref_h2, ref_out = gated_adaln_fp64(x, y, gate, scale, shift, None, 1e-6, "layer")
            assert_close_to(h2, ref_h2, dt)
            assert_close_to(out, ref_out, dt)


@pytest.mark.parametrize("hidden", [1, 5, 33, 4545])
def test_odd_hidden(hidden):
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    for dtype in DTYPES:
        x, r = rand(37, hidden, dtype=dtype, gen=gen), rand(37, hidden, dtype=dtype, gen=gen)
        w = rand(hidden, dtype=dtype, gen=gen)
        out, s = kiln.fused_add_rms_norm(x, r, w)
        ref_out, ref_s = fused_add_rms_norm_fp64(x, r, w, 1e-6)
        assert_close_to(out, ref_out, dtype)
        assert_close_to(kiln.layer_norm(x, w, w), layer_norm_fp64(x, w, w, 1e-5), dtype)
        x3 = x.reshape(1, 37, hidden)
        m = rand(1, 1, hidden, dtype=dtype, gen=gen)
        assert_close_to(kiln.adaln(x3, m, m, w), adaln_fp64(x3, m, m, w), dtype)


def test_strided_inputs():
    gen = torch.Generator(device="cuda").manual_seed(9)
    dt = torch.bfloat16
    x = rand(3, 4, 5, 256, dtype=dt, gen=gen).transpose(1, 2)  # not collapsible: copied
    r = rand(3, 5, 4, 256, dtype=dt, gen=gen)
    out, s = kiln.fused_add_rms_norm(x, r, None)
    ref_out, ref_s = fused_add_rms_norm_fp64(x, r, None, 1e-6)
    assert_close_to(out, ref_out, dt)
    wide = rand(64, 512, dtype=dt, gen=gen)[:, 1:257]  # 2-byte aligned rows
    assert_close_to(kiln.layer_norm(wide), layer_norm_fp64(wide, None, None, 1e-5), dt)
    # in place on a strided view writes through to the base tensor
    base_x, base_r = rand(8, 512, dtype=dt, gen=gen), rand(8, 512, dtype=dt, gen=gen)
    vx, vr = base_x[:, :256], base_r[:, 256:]
    ref_out, ref_s = fused_add_rms_norm_fp64(vx, vr, None, 1e-6)
    kiln.fused_add_rms_norm_(vx, vr, None)
    assert_close_to(base_r[:, 256:], ref_s, dt)
    assert_close_to(base_x[:, :256], ref_out, dt)


def test_graph_capture_and_compile():
    gen = torch.Generator(device="cuda").manual_seed(3)
    dt = torch.bfloat16
    x, y = rand(2, 64, 1024, dtype=dt, gen=gen), rand(2, 64, 1024, dtype=dt, gen=gen)
    m = rand(2, 1, 1024, dtype=dt, gen=gen)
    kiln.gated_adaln(x, y, m, m, m)  # resolve outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        h2, out = kiln.gated_adaln(x, y, m, m, m)
    x.copy_(rand(2, 64, 1024, dtype=dt, gen=gen))
    graph.replay()
    torch.cuda.synchronize()
    ref_h2, ref_out = gated_adaln_fp64(x, y, m, m, m)
    assert_close_to(out, ref_out, dt)

    compiled = torch.compile(lambda a, b: kiln.layer_norm(a + b) * 2, fullgraph=True)
    for rows in (8, 24):
        a, b = rand(rows, 512, dtype=dt, gen=gen), rand(rows, 512, dtype=dt, gen=gen)
        assert_close_to(compiled(a, b), layer_norm_fp64(a + b, None, None, 1e-5) * 2, dt)


def test_tuned_kernels_are_correct(tmp_path):
    """With tuning on (persistent and one-pass candidates), the winners compute the same
    function as the reference."""
    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path), tune="fast")
    gen = torch.Generator(device="cuda").manual_seed(4)
    try:
        for dtype in DTYPES:
            for hidden, rows in ((2048, 5376), (4096, 1), (14848, 128)):
                x, r = rand(rows, hidden, dtype=dtype, gen=gen), rand(rows, hidden, dtype=dtype, gen=gen)
                poison_allocator(x.shape, dtype)
                out, s = kiln.fused_add_rms_norm(x, r, None)
                assert_close_to(out, fused_add_rms_norm_fp64(x, r, None, 1e-6)[0], dtype)
                x3 = x.reshape(1, rows, hidden)
                m = rand(1, rows, hidden, dtype=dtype, gen=gen, scale=0.3)
                assert_close_to(kiln.adaln(x3, m, m), adaln_fp64(x3, m, m), dtype)
                # Wan's: fp32 table rows beside 16-bit rows.
                rows_f32 = torch.randn(2, hidden, device="cuda", generator=gen) * 0.3
                assert_close_to(kiln.adaln(x3, m, m, None, 1e-6, "layer", rows_f32[0], rows_f32[1]),
                                adaln_fp64(x3, m, m, None, 1e-6, "layer", rows_f32[0], rows_f32[1]), dtype)
        assert list(tmp_path.rglob("*.json")), "tuning results were not stored"
    finally:
        kiln.configure(cache_dir=before["cache_dir"], tune=before["tune_mode"])
