"""clamped_swiglu (GPT-OSS's expert gate) on the GPU against fp64 math, fresh random inputs
across both clamps, output memory poisoned first: every dtype, odd and even widths, one row and
many, interleaved pairs and halves, rows apart; its backward against fp64 autograd; a graph
capture; and a GPT-OSS-shaped model patched end to end."""

import pytest
import torch

import kiln
from activation_reference import clamped_swiglu_fp64, gpt_oss_gate_up
from reference import assert_close_to

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
WIDTHS = [1, 5, 33, 2880, 4545]
ROWS = [1, 4, 333]


def poison_allocator(shape, dtype):
    """NaN in the caching allocator's free block the op's output will reuse: an element the
    kernel fails to write shows up as NaN."""
    junk = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del junk


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("interleaved", [True, False])
def test_matches_fp64(dtype, width, rows, interleaved):
    gate_up = gpt_oss_gate_up((rows, 2 * width), dtype, "cuda")
    poison_allocator((rows, width), dtype)
    out = kiln.clamped_swiglu(gate_up, interleaved=interleaved)
    assert out.dtype == dtype and out.shape == (rows, width) and out.is_contiguous()
    assert_close_to(out, clamped_swiglu_fp64(gate_up, interleaved=interleaved), dtype)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rows_apart_and_other_scalars(interleaved):
    """gate_up as a slice of wider rows (the row index space), and scalars other than GPT-OSS's."""
    wide = gpt_oss_gate_up((3, 50, 2 * 2880 + 64), torch.bfloat16, "cuda", limit=4.0)
    gate_up = wide[..., 32:32 + 2 * 2880]
    poison_allocator((3, 50, 2880), torch.bfloat16)
    out = kiln.clamped_swiglu(gate_up, 0.75, 4.0, interleaved)
    assert_close_to(out, clamped_swiglu_fp64(gate_up, 0.75, 4.0, interleaved), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [7, 2880])
@pytest.mark.parametrize("rows", [1, 257])
@pytest.mark.parametrize("interleaved", [True, False])
def test_gradient_matches_fp64(dtype, width, rows, interleaved):
    gate_up = gpt_oss_gate_up((rows, 2 * width), dtype, "cuda").requires_grad_()
    dy = torch.randn(rows, width, device="cuda").to(dtype)
    out = kiln.clamped_swiglu(gate_up, interleaved=interleaved)
    poison_allocator(gate_up.shape, dtype)
    (grad,) = torch.autograd.grad(out, gate_up, dy)
    reference = gate_up.detach().double().requires_grad_()
    (expected,) = torch.autograd.grad(clamped_swiglu_fp64(reference, interleaved=interleaved), reference,
                                      dy.double())
    assert grad.dtype == dtype and grad.shape == gate_up.shape
    assert_close_to(grad, expected, dtype)


def test_nan_passes_the_clamps_on_the_gpu():
    gate_up = torch.tensor([[float("nan"), 1.0, 1.0, float("nan"), 9.0, -9.0]], device="cuda")
    out = kiln.clamped_swiglu(gate_up)
    assert torch.isnan(out[0, :2]).all() and not torch.isnan(out[0, 2])


def test_graph_capture_replays_new_inputs():
    gate_up = gpt_oss_gate_up((4, 2 * 2880), torch.bfloat16, "cuda")
    kiln.clamped_swiglu(gate_up)  # resolve outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kiln.clamped_swiglu(gate_up)
    gate_up.copy_(gpt_oss_gate_up(gate_up.shape, torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to(captured, clamped_swiglu_fp64(gate_up), torch.bfloat16)


def test_gpt_oss_experts_patched_on_the_gpu(monkeypatch):
    """A GPT-OSS-shaped layer's MoE block (router and experts), patched: one kiln call gates every
    routed token. The block is called on the same hidden states before and after, so the router
    picks the same experts and the outputs differ by the gate's rounding alone (a whole model in
    bf16 flips near-tied routing choices on any rounding change: its logits move by a third
    between bf16 and fp32 runs of the unpatched model)."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no GPT-OSS")
    from kiln import activation_ops

    config = transformers.GptOssConfig(vocab_size=128, hidden_size=256, intermediate_size=384, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                       num_local_experts=8, num_experts_per_tok=4, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, experts_implementation="grouped_mm")
    with torch.no_grad():
        model.model.layers[0].mlp.experts.gate_up_proj.normal_(0, 1.0)  # routed values cross the clamps
    model = model.to("cuda", torch.bfloat16).eval()
    block = model.model.layers[0].mlp
    hidden = torch.randn(2, 33, 256, device="cuda", dtype=torch.bfloat16)

    def run():
        with torch.no_grad():
            out = block(hidden)
        return (out[0] if isinstance(out, tuple) else out).float()

    expected = run()
    report = kiln.patch(model)
    assert sum(r.op == "clamped_swiglu" for r in report.replaced) == 1
    calls = []
    real = activation_ops.clamped_swiglu
    monkeypatch.setattr(activation_ops, "clamped_swiglu",
                        lambda *a, **k: calls.append(tuple(a[0].shape)) or real(*a, **k))
    actual = run()
    assert calls == [(2 * 33 * 4, 2 * 384)]
    torch.testing.assert_close(actual, expected, rtol=0.05, atol=0.02 * expected.abs().max().item())
    kiln.unpatch(model)
