"""The CUDA path against fp64 math on fresh random inputs, output memory poisoned first."""

import os

import pytest
import torch

import kiln
from reference import assert_close_to, rms_norm_fp64

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HIDDEN = [768, 1536, 2048, 3072, 3584, 4096, 4544, 5120, 8192, 14848]
ROWS = [1, 7, 128, 4096, 16384]


def poison_allocator(shape, dtype):
    """Leaves NaN in the caching allocator's free block that the op's output will reuse,
    so an element the kernel fails to write shows up as NaN."""
    junk = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del junk


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("with_weight", [True, False])
def test_grid(dtype, hidden, with_weight):
    gen = torch.Generator(device="cuda").manual_seed(hidden * 7 + len(ROWS))
    w = (1 + 0.5 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype) if with_weight else None
    for rows in ROWS:
        x = (torch.randn(rows, hidden, device="cuda", generator=gen) * 2 + 0.3).to(dtype)
        poison_allocator(x.shape, dtype)
        out = kiln.rms_norm(x, w, 1e-5)
        assert out.dtype == dtype and out.shape == x.shape
        assert_close_to(out, rms_norm_fp64(x, w, 1e-5), dtype)


@pytest.mark.parametrize("hidden", [1, 5, 33, 4545])
def test_odd_hidden(hidden):
    for dtype in DTYPES:
        x = torch.randn(37, hidden, device="cuda").to(dtype)
        w = torch.randn(hidden, device="cuda").to(dtype)
        poison_allocator(x.shape, dtype)
        assert_close_to(kiln.rms_norm(x, w), rms_norm_fp64(x, w, 1e-6), dtype)


def test_leading_shapes_non_contiguous_and_unaligned():
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(3, 4, 5, 256, device="cuda", dtype=torch.bfloat16)
    assert_close_to(kiln.rms_norm(x, w), rms_norm_fp64(x, w, 1e-6), torch.bfloat16)
    t = x.transpose(1, 2)
    assert_close_to(kiln.rms_norm(t, w), rms_norm_fp64(t, w, 1e-6), torch.bfloat16)
    wide = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)[:, 1:257]  # 2-byte aligned rows
    assert_close_to(kiln.rms_norm(wide, w), rms_norm_fp64(wide, w, 1e-6), torch.bfloat16)


def test_zero_rows():
    out = kiln.rms_norm(torch.randn(0, 64, device="cuda"), torch.randn(64, device="cuda"))
    assert out.shape == (0, 64) and out.is_cuda


def test_current_stream_is_used():
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = kiln.rms_norm(x, w)
    side.synchronize()
    assert_close_to(out, rms_norm_fp64(x, w, 1e-6), torch.bfloat16)


def test_cuda_graph_capture_after_warmup():
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    kiln.rms_norm(x, w)  # resolve outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = kiln.rms_norm(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to(out, rms_norm_fp64(x, w, 1e-6), torch.bfloat16)


def test_compile_fullgraph_cuda():
    def block(x, w):
        return kiln.rms_norm(x + 1, w) * 2

    compiled = torch.compile(block, fullgraph=True)
    for rows in (8, 24):  # a second batch size must not need a graph break
        x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
        assert_close_to(compiled(x, w), rms_norm_fp64(x + 1, w, 1e-6) * 2, torch.bfloat16)


def test_tuned_kernels_are_correct(tmp_path):
    """With tuning on, the winners (whatever they are) compute the same function, and a
    second process-level resolve comes from the disk cache with no compile."""
    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path), tune="fast")
    try:
        for dtype in DTYPES:
            for hidden, rows in ((2048, 4096), (4096, 1), (14848, 128)):
                x = torch.randn(rows, hidden, device="cuda").to(dtype)
                w = torch.randn(hidden, device="cuda").to(dtype)
                poison_allocator(x.shape, dtype)
                assert_close_to(kiln.rms_norm(x, w), rms_norm_fp64(x, w, 1e-6), dtype)
        assert list(tmp_path.rglob("*.json")), "tuning results were not stored"
        compiles = kiln.stats()["compiles"]
        kiln._C.forget_kernels()
        x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
        assert_close_to(kiln.rms_norm(x, w), rms_norm_fp64(x, w, 1e-6), torch.bfloat16)
        assert kiln.stats()["compiles"] == compiles, "warm resolve compiled again"
    finally:
        kiln.configure(cache_dir=before["cache_dir"], tune=before["tune_mode"])


def test_tune_times_the_calls_rows(tmp_path):
    """A bucket is tuned on the rows of the call that missed it (how many waves they make of
    each config's CTAs decides the winner); the result, report and stored document say so,
    and a later call of the bucket at other rows uses it without tuning again."""
    import json

    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path), tune="fast")
    try:
        x = torch.randn(2688, 3072, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
        poison_allocator(x.shape, torch.bfloat16)
        assert_close_to(kiln.rms_norm(x, w), rms_norm_fp64(x, w, 1e-6), torch.bfloat16)
        results = [r for d in json.loads(kiln.report("json"))["devices"] for r in d["results"]]
        (result,) = [r for r in results if r["op"] == "rms_norm"]
        assert (result["bucket_rows"], result["rows"]) == (4096, 2688)
        assert result["bytes_moved"] == 2 * 2688 * 3072 * 2 + 3072 * 2
        (stored,) = tmp_path.rglob(f"{result['problem_key']}.r4096.json")
        assert json.loads(stored.read_text())["rows"] == 2688
        tunes = kiln.stats()["tunes"]
        x = torch.randn(4000, 3072, device="cuda", dtype=torch.bfloat16)
        assert_close_to(kiln.rms_norm(x, w), rms_norm_fp64(x, w, 1e-6), torch.bfloat16)
        assert kiln.stats()["tunes"] == tunes, "a call of the same bucket tuned again"
    finally:
        kiln.configure(cache_dir=before["cache_dir"], tune=before["tune_mode"])
