"""torch.compile(fullgraph=True) of a model mixing nn.Linear with kiln's ops on CPU: one graph,
no graph break, no recompile on a new batch size, the eager result. kiln.warmup's report."""

import pytest
import torch

import kiln
from graph_model import inputs, model, rope_tables


def test_one_graph_no_break():
    block = model("cpu")
    cos, sin = rope_tables("cpu")
    x, cond = inputs(3, "cpu")
    explanation = torch._dynamo.explain(block)(x, cond, cos, sin)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_no_recompile_on_new_batch_sizes(backend):
    torch._dynamo.reset()
    block = model("cpu")
    cos, sin = rope_tables("cpu")
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    x, cond = inputs(3, "cpu")
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(cond, 0)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, cond, cos, sin), block(x, cond, cos, sin),
                                   rtol=1e-5, atol=1e-5)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for batch in (2, 5, 9):
                x, cond = inputs(batch, "cpu")
                torch.testing.assert_close(compiled(x, cond, cos, sin), block(x, cond, cos, sin),
                                           rtol=1e-5, atol=1e-5)


def test_warmup_report_on_cpu():
    block = model("cpu")
    cos, sin = rope_tables("cpu")
    x, cond = inputs(4, "cpu")
    report = kiln.warmup(block, x, cond, cos, sin, batch_sizes=[2, 7])
    # CPU ops are kiln's reference implementations: nothing to compile or load.
    assert report.kernels == [] and report.compiled == 0 and report.tuned == 0
    assert report.batch_sizes == [2, 7] and report.seconds > 0
    assert "kernels ready" in str(report)


def test_warmup_resizes_batch_tensors_only():
    seen = []

    def record(x, cond, cos, sin, scale=1.0):
        seen.append((tuple(x.shape), tuple(cond.shape), tuple(cos.shape), scale))
        return x

    x, cond = inputs(3, "cpu")
    cos, sin = rope_tables("cpu")
    kiln.warmup(record, x, cond, cos, sin, batch_sizes=[1, 5], scale=2.0)
    assert [s[0][0] for s in seen] == [3, 1, 5] and [s[1][0] for s in seen] == [3, 1, 5]
    assert all(s[2] == tuple(cos.shape) and s[3] == 2.0 for s in seen)


def test_warmup_bad_arguments():
    x, _ = inputs(2, "cpu")
    with pytest.raises(ValueError, match=r"kiln\.warmup: batch_sizes: expected sizes > 0, got 0"):
        kiln.warmup(lambda t: t, x, batch_sizes=[0])
    with pytest.raises(ValueError, match=r"kiln\.warmup: batch_sizes: expected a tensor input"):
        kiln.warmup(lambda n: n, 3, batch_sizes=[2])
    with pytest.raises(ValueError, match=r"kiln\.warmup: rows: expected counts > 0"):
        kiln.warmup(lambda t: t, x, rows=[-1])


@pytest.mark.parametrize("name, values, bad, expected", [
    ("capture", ("heuristic", "error"), "never", "heuristic or error"),
    ("pdl", ("on", "off"), "1", "on or off"),
])
def test_setting_round_trip(name, values, bad, expected):
    before = kiln.settings()[name]
    assert before in values
    try:
        for value in values:
            kiln.configure(**{name: value})
            assert kiln.settings()[name] == value
    finally:
        kiln.configure(**{name: before})
    with pytest.raises(ValueError, match=rf"kiln\.configure: {name}: expected {expected}, got {bad}"):
        kiln.configure(**{name: bad})
