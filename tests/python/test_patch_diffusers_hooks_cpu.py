"""kiln.patch under diffusers' own hooks (its HookRegistry: group offloading, layerwise casting,
the first-block cache and the other caches), added before or after the patch: kiln's forwards go beneath the hooks
either way, so the hooks still move the weights, cast them, or skip a block from the cache, and
the model is patched as fully as without them. unpatch puts the original forwards back beneath
the hooks; a hook removed after the patch leaves kiln's forward as the module's.

On the CPU the offloading hooks move the weights from the CPU to the CPU: what these tests see
is where the forwards sit and what the model computes; test_patch_diffusers_hooks_cuda.py moves
the weights for real."""

import pytest
import torch

import kiln
from kiln.patching import forwards, replace

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
from diffusers.hooks import (FirstBlockCacheConfig, HookRegistry, MagCacheConfig, ModelHook,  # noqa: E402
                             PyramidAttentionBroadcastConfig, TaylorSeerCacheConfig)

from test_patch_dit_cpu import FLUX_FUSED, Counter, _agree, _flux, _flux_inputs  # noqa: E402
from test_patch_mochi_cpu import _mochi, _mochi_inputs  # noqa: E402
from test_patch_wan_cpu import LAYERS, _wan, _wan_inputs  # noqa: E402

HOOKS = ["block_offload", "leaf_offload", "layerwise_casting", "first_block_cache"]


def with_hooks(model: torch.nn.Module, how: str, device: torch.device = torch.device("cpu"),
               **options) -> torch.nn.Module:
    """``model`` with one of diffusers' hook-based features enabled, as its users enable them."""
    if how == "block_offload":
        model.enable_group_offload(device, offload_type="block_level", num_blocks_per_group=1, **options)
    elif how == "leaf_offload":
        model.enable_group_offload(device, offload_type="leaf_level", **options)
    elif how == "layerwise_casting":
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=options.get(
            "compute_dtype", torch.float32))
    elif how == "first_block_cache":
        model.enable_cache(FirstBlockCacheConfig(threshold=0.05))
    else:
        raise ValueError(how)
    return model


def run(model, inputs):
    """One denoiser call as diffusers' pipelines make it: inside a cache context."""
    with torch.no_grad(), model.cache_context("cond"):
        return model(**inputs)[0]


def replaced(report):
    return sorted((r.path, r.kind) for r in report.replaced)


def hooked_and_patched(model):
    """The modules that carry both diffusers' hooks and a kiln patch."""
    return [(path, m) for path, m in model.named_modules()
            if forwards.diffusers_hooks(m) and isinstance(replace.state_of(m), replace.PatchState)]


# Offloaded leaf by leaf, the q/k norms' weights come in only when the norm modules run: the
# attentions call them (rms_norm, 4 + 2 * 2) and rotate on their own (rope, one an attention).
FLUX_LEAF_OFFLOAD = dict(FLUX_FUSED, rms_norm=8, rope=3, head_norm_rope=0, head_norm_rope_=0)
FLUX_LEAF_OFFLOAD = {k: v for k, v in FLUX_LEAF_OFFLOAD.items() if v}


@pytest.mark.parametrize("order", ["hook_then_patch", "patch_then_hook"])
@pytest.mark.parametrize("how", HOOKS)
def test_flux_patch_goes_beneath_diffusers_hooks(how, order, monkeypatch):
    inputs = _flux_inputs(torch.float32)
    unhooked = kiln.patch(_flux(torch.float32))
    expected = run(with_hooks(_flux(torch.float32), how), inputs)
    model = _flux(torch.float32)
    if order == "hook_then_patch":
        report = kiln.patch(with_hooks(model, how))
    else:
        report = kiln.patch(model)
        with_hooks(model, how)
    # Every module the patch takes without the hooks, whatever their order (the probes look
    # beneath the hooks, and an fp8-stored projection is probed in the dtype it computes in).
    assert replaced(report) == replaced(unhooked) and report.left == unhooked.left
    both = hooked_and_patched(model)
    assert both or how == "layerwise_casting"  # casting hooks only the projections, which kiln calls
    for path, module in both:
        state = replace.state_of(module)
        assert module.forward is not state.patched, path  # the hooks still run around it
        assert replace.inner_forward(module) is state.patched, path
    counter = Counter(monkeypatch)
    actual = run(model, inputs)
    assert counter.used() == (FLUX_LEAF_OFFLOAD if how == "leaf_offload" else FLUX_FUSED)
    _agree(actual, expected, torch.float32)
    assert kiln.unpatch(model) == len(report.replaced)
    for path, module in both:
        assert replace.inner_forward(module).__func__ is type(module).forward, path
        assert forwards.diffusers_hooks(module), path
    model._reset_stateful_cache()  # a new generation: the cache holds nothing of the last call
    assert torch.equal(run(model, inputs), expected)


# The first-block cache's skipped call runs the head block (the double block) and the output's
# AdaLN; the single blocks give back their cached residual without running.
FLUX_HEAD_BLOCK_ONLY = {"adaln": 3, "head_norm_rope_": 2, "gelu": 2, "gated_adaln": 2, "gated_residual_": 2}


@pytest.mark.parametrize("order", ["hook_then_patch", "patch_then_hook"])
def test_first_block_cache_skips_kiln_blocks(order, monkeypatch):
    inputs = _flux_inputs(torch.float32)
    reference = with_hooks(_flux(torch.float32), "first_block_cache")
    expected = [run(reference, inputs), run(reference, inputs)]
    model = _flux(torch.float32)
    if order == "hook_then_patch":
        kiln.patch(with_hooks(model, "first_block_cache"))
    else:
        kiln.patch(model)
        with_hooks(model, "first_block_cache")
    counter = Counter(monkeypatch)
    first = run(model, inputs)
    assert counter.used() == FLUX_FUSED
    counter.calls = dict.fromkeys(counter.calls, 0)
    second = run(model, inputs)  # the head block's residual unchanged: the rest is skipped
    assert counter.used() == FLUX_HEAD_BLOCK_ONLY
    _agree(first, expected[0], torch.float32)
    _agree(second, expected[1], torch.float32)


# diffusers' other caches, as their users configure them for a few steps: TaylorSeer's forecast of
# the blocks' outputs, pyramid attention broadcast's reuse of attention outputs, MagCache's skip
# of the blocks by the residuals' magnitude ratios.
CACHES = {
    "taylorseer": lambda: TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=2,
                                                taylor_factors_dtype=torch.float32),
    "pyramid_attention_broadcast": lambda: PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(100, 800),
        current_timestep_callback=lambda: 500),
    "magcache": lambda: MagCacheConfig(mag_ratios=torch.ones(8), num_inference_steps=8, retention_ratio=0.0),
}


@pytest.mark.parametrize("order", ["hook_then_patch", "patch_then_hook"])
@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("arch", ["flux", "wan"])
def test_caches_over_denoising_steps(arch, cache, order):
    """Eight steps of a denoising loop (the latents move a little each step) under one of
    diffusers' caches: the patched model gives what diffusers' gives at every step, cached or
    computed, and the patch takes every module it takes without the cache."""
    build, inputs = {"flux": (_flux, _flux_inputs), "wan": (_wan, _wan_inputs)}[arch]
    unhooked = kiln.patch(build(torch.float32))
    reference = build(torch.float32)
    reference.enable_cache(CACHES[cache]())
    model = build(torch.float32)
    if order == "hook_then_patch":
        model.enable_cache(CACHES[cache]())
        report = kiln.patch(model)
    else:
        report = kiln.patch(model)
        model.enable_cache(CACHES[cache]())
    assert replaced(report) == replaced(unhooked) and report.left == []
    x = inputs(torch.float32)
    for _ in range(8):
        x = dict(x, hidden_states=0.97 * x["hidden_states"])
        _agree(run(model, x), run(reference, x), torch.float32)


def test_wan_blocks_hand_over_only_where_no_hook_runs(monkeypatch):
    """A block under the cache's hook may be skipped, so no block hands its norm over to it;
    once the cache is disabled (its registry stays on the block, empty) they do again."""
    inputs = _wan_inputs(torch.float32)
    model = _wan(torch.float32)
    kiln.patch(model)
    with_hooks(model, "first_block_cache")
    counter = Counter(monkeypatch)
    cached = run(model, inputs)
    assert counter.calls["adaln"] == LAYERS and counter.calls["gated_adaln"] == 2 * LAYERS
    model.disable_cache()
    assert all(hasattr(b, "_diffusers_hook") and not forwards.any_hooks(b) for b in model.blocks)
    counter.calls = dict.fromkeys(counter.calls, 0)
    handed_over = run(model, inputs)
    assert counter.calls["adaln"] == 1 and counter.calls["gated_adaln"] == 2 * LAYERS + LAYERS - 1
    _agree(handed_over, cached, torch.float32)


def test_hook_removed_after_patch_leaves_kiln_forward():
    model = _flux(torch.float32)
    with_hooks(model, "first_block_cache")
    kiln.patch(model)
    block = model.transformer_blocks[0]
    patched = replace.state_of(block).patched
    model.disable_cache()
    assert block.__dict__["forward"] is patched
    kiln.unpatch(model)
    assert "forward" not in block.__dict__


def test_mochi_with_fp8_storage_patches_as_without():
    """Mochi's packed feed-forward and its GELUs are probed in the dtype they compute in; an
    fp8-stored projection once made the patch raise."""
    unhooked = kiln.patch(_mochi(torch.float32))
    model = with_hooks(_mochi(torch.float32), "layerwise_casting")
    expected = run(model, _mochi_inputs(torch.float32))
    report = kiln.patch(model)
    assert replaced(report) == replaced(unhooked)
    _agree(run(model, _mochi_inputs(torch.float32)), expected, torch.float32)


class _Counting(ModelHook):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def pre_forward(self, module, *args, **kwargs):
        self.calls += 1
        return args, kwargs


def test_probes_run_beneath_the_hooks_of_the_modules_they_call():
    """kiln's probes run a module on stand-in weights and CPU tensors; a hook on a module it
    calls (leaf offloading's brings the real weights to the GPU) is not run by them. The forward
    runs it: kiln calls the hooked norms rather than read their weights."""
    model = _flux(torch.float32)
    attn = model.transformer_blocks[0].attn
    hooks = {name: _Counting() for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")}
    for name, hook in hooks.items():
        HookRegistry.check_if_exists_or_initialize(getattr(attn, name)).register_hook(hook, "counting")
    report = kiln.patch(model)
    assert report.left == [] and [h.calls for h in hooks.values()] == [0, 0, 0, 0]
    assert dict(replaced(report))["transformer_blocks.0.attn"] == "flux attention (per-head q/k rms_norm + rope)"
    run(model, _flux_inputs(torch.float32))
    assert [h.calls for h in hooks.values()] == [1, 1, 1, 1]
