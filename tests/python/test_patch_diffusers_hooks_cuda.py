"""kiln.patch under diffusers' group offloading and layerwise casting on a GPU, and under
accelerate's offloading, each enabled before or after the patch: the offloading hooks bring each
block's (or leaf's) weights from the CPU around kiln's forwards, the casting hooks upcast
fp8-stored projections, and the patched bf16 model is as close to the truth as diffusers' own
(test_patch_diffusers_hooks_cpu.py has the rest)."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cpu import FLUX_FUSED, Counter, _flux, _flux_inputs  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_diffusers_hooks_cpu import FLUX_LEAF_OFFLOAD, run, with_hooks  # noqa: E402
from test_patch_wan_cpu import LAYERS, _wan, _wan_inputs  # noqa: E402

CUDA = torch.device("cuda")
ORDERS = ["hook_then_patch", "patch_then_hook"]


def _hooked_patched(model, how, order, **options):
    if order == "hook_then_patch":
        report = kiln.patch(with_hooks(model, how, CUDA, **options))
    else:
        report = kiln.patch(model)
        with_hooks(model, how, CUDA, **options)
    assert report.left == []
    return model


def _without_gelu(calls):
    """The calls but kiln.gelu's (on CUDA a projection's tanh GELU may run in its epilogue)."""
    return {op: n for op, n in calls.items() if op != "gelu"}


@pytest.mark.gpu
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("how,options", [("block_offload", {}), ("block_offload", {"use_stream": True}),
                                         ("leaf_offload", {"use_stream": True})],
                         ids=["blocks", "blocks-streamed", "leaves-streamed"])
def test_flux_group_offload_cuda(how, options, order, monkeypatch):
    inputs = _flux_inputs(torch.bfloat16, "cuda")
    truth = run(_flux(torch.float32, "cuda"), _flux_inputs(torch.float32, "cuda"))
    original = run(with_hooks(_flux(torch.bfloat16), how, CUDA, **options), inputs)
    model = _hooked_patched(_flux(torch.bfloat16), how, order, **options)
    counter = Counter(monkeypatch)
    patched = run(model, inputs)
    assert _without_gelu(counter.used()) == _without_gelu(FLUX_LEAF_OFFLOAD if how == "leaf_offload" else FLUX_FUSED)
    _as_close_as_the_original(patched, original, truth)
    torch.cuda.synchronize()
    assert model.transformer_blocks[0].ff.net[2].weight.device.type == "cpu"  # offloaded again


@pytest.mark.gpu
@pytest.mark.parametrize("order", ORDERS)
def test_wan_block_offload_cuda(order, monkeypatch):
    """Wan's blocks under block offloading: each block computes its own norm1 (a hook runs
    around the next block, which the hand-over would skip) with its weights brought in."""
    inputs = _wan_inputs(torch.bfloat16, "cuda")
    truth = run(_wan(torch.float32, "cuda"), _wan_inputs(torch.float32, "cuda"))
    original = run(with_hooks(_wan(torch.bfloat16), "block_offload", CUDA, use_stream=True), inputs)
    model = _hooked_patched(_wan(torch.bfloat16), "block_offload", order, use_stream=True)
    counter = Counter(monkeypatch)
    patched = run(model, inputs)
    assert counter.calls["adaln"] == LAYERS and counter.calls["gated_adaln"] == 2 * LAYERS
    assert counter.calls["rms_norm_rope"] == LAYERS
    _as_close_as_the_original(patched, original, truth)


@pytest.mark.gpu
@pytest.mark.parametrize("order", ORDERS)
def test_flux_fp8_layerwise_casting_cuda(order, monkeypatch):
    """Projections stored in fp8 and computed in bf16: the truth is the same fp8 weights
    computed in fp32."""
    inputs = _flux_inputs(torch.bfloat16, "cuda")
    truth = run(with_hooks(_flux(torch.float32, "cuda"), "layerwise_casting"), _flux_inputs(torch.float32, "cuda"))
    cast = dict(compute_dtype=torch.bfloat16)
    original = run(with_hooks(_flux(torch.bfloat16, "cuda"), "layerwise_casting", **cast), inputs)
    model = _flux(torch.bfloat16, "cuda")
    if order == "hook_then_patch":
        report = kiln.patch(with_hooks(model, "layerwise_casting", **cast))
    else:
        report = kiln.patch(model)
        with_hooks(model, "layerwise_casting", **cast)
    assert report.left == []
    assert model.transformer_blocks[0].ff.net[2].weight.dtype == torch.float8_e4m3fn
    counter = Counter(monkeypatch)
    patched = run(model, inputs)
    # The hooked projections keep their own GELU (kiln.gelu, not the epilogue).
    assert counter.used() == FLUX_FUSED
    _as_close_as_the_original(patched, original, truth)


def _accelerate_offloaded(model, order, offload):
    if order == "hook_then_patch":
        offload(model)
        report = kiln.patch(model)
    else:
        report = kiln.patch(model)
        offload(model)
    assert report.left == []
    return model


@pytest.mark.gpu
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("sequential", [False, True], ids=["model", "sequential"])
def test_flux_accelerate_offload_cuda(sequential, order, monkeypatch):
    """accelerate's offloading to the GPU: the whole model brought in around its forward
    (enable_model_cpu_offload's hook), or each leaf's weights around its own (cpu_offload: the q/k
    norms then run as modules, as under leaf-level group offloading). The probes run beneath the
    leaves' hooks, which would bring the real weights to the GPU in place of the stand-ins."""
    accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed")

    def offload(model):
        if sequential:
            accelerate.cpu_offload(model, execution_device=CUDA)
        else:
            accelerate.cpu_offload_with_hook(model, execution_device=CUDA)

    inputs = _flux_inputs(torch.bfloat16, "cuda")
    truth = run(_flux(torch.float32, "cuda"), _flux_inputs(torch.float32, "cuda"))
    reference = _flux(torch.bfloat16)
    offload(reference)
    original = run(reference, inputs)
    model = _accelerate_offloaded(_flux(torch.bfloat16), order, offload)
    counter = Counter(monkeypatch)
    patched = run(model, inputs)
    assert _without_gelu(counter.used()) == _without_gelu(FLUX_LEAF_OFFLOAD if sequential else FLUX_FUSED)
    _as_close_as_the_original(patched, original, truth)
