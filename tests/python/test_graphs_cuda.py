"""kiln under torch.compile and CUDA graphs on a GPU: fullgraph with no graph break and no
recompile on a new batch size, mode="reduce-overhead", manual torch.cuda.CUDAGraph capture
(nn.Linear before kiln's ops; default and side stream) replayed on new data, and the capture
rule (never compile inside a capture: KILN_CAPTURE=heuristic|error) in fresh processes with
empty caches."""

import pytest
import torch

import kiln
from cache_helpers import run_kiln
from graph_model import inputs, model, rope_tables

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]
TOL = dict(rtol=1e-4, atol=1e-4)


def test_one_graph_no_break():
    block = model("cuda")
    cos, sin = rope_tables("cuda")
    x, cond = inputs(3, "cuda")
    explanation = torch._dynamo.explain(block)(x, cond, cos, sin)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_no_recompile_on_new_batch_sizes():
    torch._dynamo.reset()
    block = model("cuda")
    cos, sin = rope_tables("cuda")
    compiled = torch.compile(block, fullgraph=True)
    x, cond = inputs(3, "cuda")
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(cond, 0)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, cond, cos, sin), block(x, cond, cos, sin), **TOL)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for batch in (2, 5, 33):
                x, cond = inputs(batch, "cuda")
                torch.testing.assert_close(compiled(x, cond, cos, sin), block(x, cond, cos, sin),
                                           **TOL)


def test_reduce_overhead_equals_eager():
    torch._dynamo.reset()
    block = model("cuda")
    cos, sin = rope_tables("cuda")
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for seed in range(4):  # the first runs warm up, the later ones replay the graph
            x, cond = inputs(4, "cuda", seed=seed)
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(x, cond, cos, sin).clone()
            torch.testing.assert_close(out, block(x, cond, cos, sin), **TOL)


@pytest.mark.parametrize("side_stream", [False, True])
def test_manual_capture_replays_new_data(side_stream):
    block = model("cuda")
    cos, sin = rope_tables("cuda")
    static_x, static_cond = inputs(4, "cuda")
    with torch.no_grad():
        kiln.warmup(block, static_x, static_cond, cos, sin)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # cuBLAS sets up its workspace for this stream
            block(static_x, static_cond, cos, sin)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream if side_stream else None):
            static_out = block(static_x, static_cond, cos, sin)
        for seed in (1, 2):
            x, cond = inputs(4, "cuda", seed=100 + seed)
            static_x.copy_(x)
            static_cond.copy_(cond)
            static_out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(static_out, block(x, cond, cos, sin), rtol=1e-5, atol=1e-5)


def test_warmup_then_capture_at_another_batch_size_in_error_mode():
    block = model("cuda")
    cos, sin = rope_tables("cuda")
    kiln.configure(capture="error")  # (also forgets loaded kernels: warmup must ready them)
    try:
        x, cond = inputs(4, "cuda")
        report = kiln.warmup(block, x, cond, cos, sin, batch_sizes=[16])
        buckets = {(k["op"], k["rows_bucket"]) for k in report.kernels}
        # rms_norm/adaln/swiglu at 24 and 96 rows, rope at its own rows: two buckets each
        assert {op for op, _ in buckets} >= {"rms_norm", "adaln", "rope", "swiglu"}, buckets
        assert len(buckets) >= 8, buckets
        static_x, static_cond = inputs(16, "cuda")
        with torch.no_grad():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = block(static_x, static_cond, cos, sin)
            x, cond = inputs(16, "cuda", seed=5)
            static_x.copy_(x)
            static_cond.copy_(cond)
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(static_out, block(x, cond, cos, sin), rtol=1e-5, atol=1e-5)
    finally:
        kiln.configure(capture="heuristic")


CAPTURE_PRELUDE = """
import json, torch, kiln
kiln.device_info()  # probe outside the capture
gen = torch.Generator(device="cuda").manual_seed(1)
w = torch.randn(256, device="cuda", generator=gen)

def reference(t):
    t64 = t.double()
    return (t64 * torch.rsqrt(t64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).float()

def capture(rows):
    x = torch.randn(rows, 256, device="cuda", generator=gen)
    torch.cuda.synchronize()
    before = kiln.stats()["nvrtc_compiles"]
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = kiln.rms_norm(x, w)
    except Exception as error:
        return {"error": str(error), "compiles": kiln.stats()["nvrtc_compiles"] - before}
    compiles = kiln.stats()["nvrtc_compiles"] - before
    x.copy_(torch.randn(rows, 256, device="cuda", generator=gen))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return {"error": None, "compiles": compiles,
            "max_err": (out - reference(x)).abs().max().item()}
"""


def test_capture_with_empty_cache_refuses_to_compile(tmp_path):
    code, result, stderr = run_kiln(CAPTURE_PRELUDE + """
first = capture(8)
loaded_after_failure = kiln._C.loaded_kernels()
kiln.rms_norm(torch.randn(8, 256, device="cuda"), w)   # a warm-up outside the capture
second = capture(8)
print(json.dumps({"first": first, "loaded": loaded_after_failure, "second": second}))
""", tmp_path / "cache", {"KILN_TUNE": "off"})
    assert code == 0, stderr
    first = result["first"]
    assert first["compiles"] == 0 and result["loaded"] == []
    assert "kiln.rms_norm: a CUDA graph is being captured" in first["error"]
    assert "neither loaded nor in the binary store" in first["error"]
    assert "kiln.warmup" in first["error"] and "kiln prewarm" in first["error"]
    assert result["second"]["error"] is None and result["second"]["compiles"] == 0
    assert result["second"]["max_err"] < 1e-4


def test_capture_uses_the_cached_heuristic_binary(tmp_path):
    cache = tmp_path / "cache"
    # One process stores the heuristic binary (tuning off: no tuning result is stored) ...
    code, _, stderr = run_kiln("""
import torch, kiln
kiln.rms_norm(torch.randn(8, 256, device="cuda"), torch.randn(256, device="cuda"))
torch.cuda.synchronize()
""", cache, {"KILN_TUNE": "off"})
    assert code == 0, stderr
    # ... a fresh one, tuning on, first meets the problem inside a capture: no tune, no
    # compile; the heuristic binary comes from the disk cache.
    code, result, stderr = run_kiln(CAPTURE_PRELUDE + """
captured = capture(8)
print(json.dumps({"captured": captured, "tunes": kiln.stats()["tunes"],
                  "loaded": kiln._C.loaded_kernels()}))
""", cache, {"KILN_TUNE": "fast"})
    assert code == 0, stderr
    assert result["captured"]["error"] is None, result
    assert result["captured"]["compiles"] == 0 and result["tunes"] == 0
    assert result["captured"]["max_err"] < 1e-4
    (kernel,) = result["loaded"]
    assert kernel["in_capture"] and kernel["heuristic_only"] and kernel["op"] == "rms_norm"


def test_error_mode_needs_warmup_and_warmup_covers_other_rows(tmp_path):
    code, result, stderr = run_kiln(CAPTURE_PRELUDE + """
unwarmed = capture(8)
report = kiln.warmup(lambda t: kiln.rms_norm(t, w), torch.randn(8, 256, device="cuda"),
                     batch_sizes=[64], rows=[1000])
print(json.dumps({"unwarmed": unwarmed, "buckets": sorted(k["rows_bucket"] for k in report.kernels),
                  "compiled": report.compiled, "rows8": capture(8), "rows64": capture(64),
                  "rows1000": capture(1000), "rows5000": capture(5000)}))
""", tmp_path / "cache", {"KILN_TUNE": "off", "KILN_CAPTURE": "error"})
    assert code == 0, stderr
    assert "is not loaded in this process (KILN_CAPTURE=error)" in result["unwarmed"]["error"]
    assert result["unwarmed"]["compiles"] == 0
    assert result["buckets"] == [8, 64, 1024] and result["compiled"] >= 1
    for rows in ("rows8", "rows64", "rows1000"):
        assert result[rows]["error"] is None and result[rows]["compiles"] == 0, result[rows]
        assert result[rows]["max_err"] < 1e-4
    # a bucket the warm-up did not cover is refused, not compiled
    assert "rows<=8192" in result["rows5000"]["error"] and result["rows5000"]["compiles"] == 0
