"""kiln.patch on diffusion transformers (CPU): LTX-Video's attention processor and block
seams, FLUX's attention RoPE and AdaLN modules, the LTX VAE's norms; patched vs unpatched,
unpatch restoring the original processors and forwards, accelerate's hooks.

Tolerances: in fp32 kiln and diffusers differ only in fp32 rounding order (1e-5 of the
output's scale through a tiny model). In bf16 kiln rounds each fused seam once where
diffusers rounds after every elementwise op; through two blocks the differences compound
to a few bf16 ulps of the output's scale (8 ulps allowed, as for the module-level patch).
"""

import pytest
import torch

import kiln
from kiln import activation_ops, norm_ops, ops as kiln_ops, rope_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor  # noqa: E402
from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor  # noqa: E402

from test_patch_diffusers_cpu import _ltx, _ltx_inputs, _ltx_out  # noqa: E402
from graph_model import calls_of, compile_capturing  # noqa: E402

try:
    import accelerate
    import accelerate.hooks as accelerate_hooks
except ImportError:
    accelerate = None
needs_accelerate = pytest.mark.skipif(accelerate is None, reason="accelerate is not installed")

WRAPPED = ((kiln_ops, "rms_norm"), (norm_ops, "layer_norm"), (norm_ops, "adaln"), (norm_ops, "gated_adaln"),
           (activation_ops, "gelu"), (activation_ops, "gated_residual"), (activation_ops, "gated_residual_"),
           (rope_ops, "rms_norm_rope"), (rope_ops, "rope"), (rope_ops, "head_norm_rope"),
           (rope_ops, "head_norm_rope_"))


class Counter:
    """Counts the kiln op wrappers' calls (and rms_norm_rope's calls with a grid); ``more``:
    (module, name) pairs of other wrappers to count."""

    def __init__(self, monkeypatch, more=()):
        self.calls = {name: 0 for _, name in WRAPPED + tuple(more)}
        self.calls["rms_norm_rope grid"] = 0
        for module, name in WRAPPED + tuple(more):
            monkeypatch.setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            self.calls[name] += 1
            if kwargs.get("grid") is not None:
                self.calls[name + " grid"] += 1
            return fn(*args, **kwargs)

        return counted

    def used(self):
        return {k: v for k, v in self.calls.items() if v}


def _max_err(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    return (actual.double() - expected.double()).abs().max().item()


def _agree(actual, expected, dtype):
    scale = expected.double().abs().max().item()
    bound = 1e-5 * (1 + scale) if dtype == torch.float32 else 8 * 2**-8 * scale
    assert _max_err(actual, expected) <= bound


def _loss_grads(model, inputs):
    """The unpatched output and the parameter gradients of mean(output^2); grads cleared."""
    expected = model(**inputs)[0]
    expected.pow(2).mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return expected, grads


def _assert_one_parameter_trains_as_diffusers(model, inputs, name, rtol=1e-4, atol=1e-6):
    """`name` alone requires grad (fp32 model): the patched model's output and that
    parameter's gradient match the unpatched model's."""
    expected, grads = _loss_grads(model, inputs)
    kiln.patch(model)
    actual = model(**inputs)[0]
    _agree(actual, expected, torch.float32)
    actual.pow(2).mean().backward()
    assert list(grads) == [name]
    torch.testing.assert_close(dict(model.named_parameters())[name].grad, grads[name],
                               rtol=rtol, atol=atol)


def _trains_as_diffusers(model, inputs, counter) -> dict:
    """The fp32 model, patched while every parameter trains: its output and every parameter's
    gradient of mean(output^2) match the unpatched model's. Returns the kiln calls the patched
    forward made (``counter()``'s)."""
    expected, grads = _loss_grads(model, inputs)
    kiln.patch(model)
    calls = counter()
    actual = model(**inputs)[0]
    used = calls.used()
    _agree(actual, expected, torch.float32)
    actual.pow(2).mean().backward()
    actual_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert actual_grads.keys() == grads.keys()
    for name, grad in actual_grads.items():
        torch.testing.assert_close(grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)
    return used


def _compiled_patched_graphs(model, inputs) -> list:
    """The graphs torch.compile makes of the patched fp32 model, whose compiled output agrees
    with the unpatched model's."""
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        compiled, graphs = compile_capturing(model)
        _agree(compiled(**inputs)[0], expected, torch.float32)
    torch._dynamo.reset()
    return graphs


def _processors(model):
    return {n: m.processor for n, m in model.named_modules() if hasattr(m, "processor")}


def _instance_forwards(model):
    """Modules with a kiln state or an instance forward other than their class's own
    (accelerate leaves the class forward bound on the instance when its hook is removed)."""
    def own(m):
        f = m.__dict__.get("forward")
        return f is None or getattr(f, "__func__", None) is type(m).forward
    return [n for n, m in model.named_modules() if not own(m) or "_kiln_patch" in m.__dict__]


# ---- LTX-Video -------------------------------------------------------------------------

# Two blocks: block 0 ends with one gated_adaln that also computes block 1's norm1 AdaLN
# (handed over, dit_block_chain.py), so one adaln, three gated_adaln, one in-place residual.
LTX_FUSED = {"rms_norm_rope": 2, "rms_norm_rope grid": 2, "rms_norm": 4, "adaln": 1, "gated_adaln": 3,
             "gated_residual": 2, "gated_residual_": 1, "gelu": 2, "layer_norm": 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ltx_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model = _ltx(dtype)
    inputs = _ltx_inputs(dtype)
    processors = _processors(model)
    expected = _ltx_out(model, inputs)
    report = kiln.patch(model)
    kinds = {r.path: r.op for r in report.replaced}
    assert kinds["rope"] == "rms_norm_rope (angles in-kernel)"
    for b in ("transformer_blocks.0", "transformer_blocks.1"):
        assert kinds[b] == "adaln + gated_residual + gated_adaln"
        assert kinds[b + ".attn1"] == kinds[b + ".attn2"] == "rms_norm_rope + rms_norm"
    assert report.left == []
    for name, proc in _processors(model).items():
        assert type(proc).__name__ == "LTXAttnProcessor" and proc.original is processors[name]
    counter = Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    # Per block: one fused q/k norm + rope (self-attention) from the grid, two q/k norms
    # (cross-attention), the AdaLN seams, two gated residuals; no other rms_norm.
    assert counter.used() == LTX_FUSED
    _agree(actual, expected, dtype)
    assert kiln.unpatch(model) == len(report.replaced)
    assert _processors(model) == processors and _instance_forwards(model) == []
    assert torch.equal(_ltx_out(model, inputs), expected)


def test_ltx_under_inference_mode(monkeypatch):
    """Inference tensors keep no version counter: the blocks hand nothing over (each
    normalises its own input) and the fused seams still run."""
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    with torch.inference_mode():
        actual = model(**inputs)[0]
    assert counter.used()["adaln"] == 2 and counter.used()["gated_adaln"] == 2
    _agree(actual, expected, torch.float32)


def test_ltx_table_rope_when_coords_are_given(monkeypatch):
    """With video_coords the rotary embedding has no grid: the diffusers tables are read."""
    dtype = torch.float32
    model = _ltx(dtype)
    inputs = _ltx_inputs(dtype)
    f, h, w = inputs.pop("num_frames"), inputs.pop("height"), inputs.pop("width")
    grid = torch.stack(torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij"))
    inputs["video_coords"] = (grid.flatten(1).float() * torch.tensor([[0.4], [32.0], [32.0]]))[None].repeat(2, 1, 1)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    assert counter.calls["rms_norm_rope"] == 2 and counter.calls["rms_norm_rope grid"] == 0
    _agree(actual, expected, dtype)


@pytest.mark.parametrize("scale", [(0.32, 32, 32), None, (torch.tensor(0.04), 32.0, 32.0)])
def test_ltx_grid_with_interpolation_scales(scale, monkeypatch):
    dtype = torch.float32
    model = _ltx(dtype)
    inputs = dict(_ltx_inputs(dtype), rope_interpolation_scale=scale)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    assert counter.calls["rms_norm_rope grid"] == 2
    _agree(actual, expected, dtype)


@pytest.mark.parametrize("dynamic", [False, True])
def test_ltx_whole_model_compile_keeps_the_grid(dynamic):
    """torch.compile of the whole patched model traces the rotary embedding too: the grid
    must reach rms_norm_rope there as in eager (no graph break), so the compiled graph
    computes the angles in the kernel and never builds diffusers' tables for it."""
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    compiled, graphs = compile_capturing(model, dynamic=dynamic)
    with torch.no_grad():
        actual = compiled(**inputs)[0]
    torch._dynamo.reset()
    calls = calls_of(graphs, torch.ops.kiln.rms_norm_rope.default)
    assert len(graphs) == 1 and len(calls) == 2
    for node in calls:
        cos, sin, grid = node.args[5:8]
        # Under dynamic shapes the grid's sizes are graph inputs, not constants.
        assert cos is None and sin is None and len(grid) == 3
        assert dynamic or list(grid) == [2, 2, 3]
    _agree(actual, expected, torch.float32)
    kiln.unpatch(model)


def test_ltx_with_grad_keeps_diffusers_path_for_the_fused_ops(monkeypatch):
    """The fused DiT ops (rms_norm_rope, adaln, gated_adaln, gated_residual) have no backward:
    a call that records a graph takes diffusers' path for them; the plain norms and the GELU
    feed-forward, whose ops have backward formulas, stay on kiln. Loss and gradients agree."""
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected, grads = _loss_grads(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = model(**inputs)[0]
    assert set(counter.used()) <= {"rms_norm", "layer_norm", "gelu"}
    assert counter.used(), "the differentiable ops stay on kiln"
    _agree(actual, expected, torch.float32)
    actual.pow(2).mean().backward()
    for name, grad in grads.items():
        p = dict(model.named_parameters())[name]
        torch.testing.assert_close(p.grad, grad, rtol=1e-4, atol=1e-6, msg=name)


def test_ltx_ops_filter_leaves_the_patterns():
    model = _ltx(torch.float32)
    report = kiln.patch(model, ops=["rms_norm"])
    reasons = {l.path: l.reason for l in report.left}
    assert "rms_norm_rope is not in ops" in reasons["transformer_blocks.0.attn1"]
    assert "rms_norm_rope is not in ops" in reasons["rope"]
    assert "adaln is not in ops" in reasons["transformer_blocks.1"]
    assert all(type(p) is LTXVideoAttnProcessor for p in _processors(model).values())
    kiln.unpatch(model)


def test_ltx_attention_backend_set_after_patch_reaches_the_original():
    model = _ltx(torch.float32)
    kiln.patch(model)
    attn = model.transformer_blocks[0].attn1
    original = attn.processor.original
    attn.processor._attention_backend = "native"
    assert original._attention_backend == "native"
    kiln.unpatch(model)
    assert attn.processor is original


def test_processor_replaced_after_patch_is_kept():
    model = _ltx(torch.float32)
    kiln.patch(model)
    attn = model.transformer_blocks[0].attn1
    mine = LTXVideoAttnProcessor()
    attn.set_processor(mine)
    with pytest.warns(UserWarning, match="attention processor was replaced after kiln.patch"):
        kiln.unpatch(model)
    assert attn.processor is mine


def test_ltx_block_with_other_seams_is_left():
    """A block whose norm1 is a LayerNorm does not compute LTX-Video's RMSNorm seams."""
    model = _ltx(torch.float32)
    block = model.transformer_blocks[0]
    block.norm1 = torch.nn.LayerNorm(block.scale_shift_table.shape[1], elementwise_affine=False)
    report = kiln.patch(model)
    reasons = {l.path: l.reason for l in report.left}
    assert reasons["transformer_blocks.0"].startswith("norm1 computes layer_norm, not an RMSNorm")
    assert "transformer_blocks.1" in {r.path for r in report.replaced}


def test_ltx_block_with_another_formula_is_left():
    """A block class that computes something else with the same attributes is left."""
    model = _ltx(torch.float32)
    block = model.transformer_blocks[0]

    class OtherBlock(type(block)):
        def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                    encoder_attention_mask=None):
            return super().forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                   encoder_attention_mask) * 2

    block.__class__ = OtherBlock
    report = kiln.patch(model)
    reasons = {l.path: l.reason for l in report.left}
    assert "does not compute LTX-Video's block seams" in reasons["transformer_blocks.0"]


def test_ltx_attention_with_a_layer_norm_is_left(monkeypatch):
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    attn = model.transformer_blocks[0].attn1
    attn.norm_q = torch.nn.LayerNorm(attn.inner_dim, elementwise_affine=False)
    expected = _ltx_out(model, inputs)
    report = kiln.patch(model)
    reasons = {l.path: l.reason for l in report.left}
    assert reasons["transformer_blocks.0.attn1"].startswith("norm_q computes layer_norm, not an RMSNorm")
    assert type(attn.processor) is LTXVideoAttnProcessor
    counter = Counter(monkeypatch)
    _agree(_ltx_out(model, inputs), expected, torch.float32)
    assert counter.calls["rms_norm_rope"] == 1


@needs_accelerate
@pytest.mark.parametrize("order", ["hook_then_patch", "patch_then_hook"])
def test_ltx_inside_accelerate_hooks(order, monkeypatch):
    class CountingHook(accelerate_hooks.ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            CountingHook.calls += 1
            return args, kwargs

    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    targets = [model.transformer_blocks[0], model.transformer_blocks[0].attn1, model.rope]
    if order == "patch_then_hook":
        kiln.patch(model)
    for m in targets:
        accelerate_hooks.add_hook_to_module(m, CountingHook())
    if order == "hook_then_patch":
        kiln.patch(model)
    block = model.transformer_blocks[0]
    assert block._old_forward is block.__dict__["_kiln_patch"].patched  # inside the hook
    counter = Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    assert CountingHook.calls == 3
    assert counter.used() == LTX_FUSED
    _agree(actual, expected, torch.float32)
    kiln.unpatch(model)
    assert block._old_forward.__func__ is type(block).forward
    assert torch.equal(_ltx_out(model, inputs), expected)
    for m in targets:
        accelerate_hooks.remove_hook_from_module(m)
    assert _instance_forwards(model) == []


@needs_accelerate
@pytest.mark.parametrize("order", ["offload_then_patch", "patch_then_offload"])
def test_ltx_model_cpu_offload_hook(order, monkeypatch):
    """enable_model_cpu_offload's hook: one hook on the whole model, which brings all of
    its weights to the execution device around the forward."""
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    if order == "offload_then_patch":
        accelerate.cpu_offload_with_hook(model, execution_device=torch.device("cpu"))
        report = kiln.patch(model)
    else:
        report = kiln.patch(model)
        accelerate.cpu_offload_with_hook(model, execution_device=torch.device("cpu"))
    assert report.left == []
    counter = Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    assert counter.used() == LTX_FUSED
    _agree(actual, expected, torch.float32)
    kiln.unpatch(model)
    assert torch.equal(_ltx_out(model, inputs), expected)


@needs_accelerate
@pytest.mark.parametrize("order", ["offload_then_patch", "patch_then_offload"])
def test_ltx_sequential_cpu_offload(order, monkeypatch):
    """Sequential offload keeps each leaf's weights on the meta device until that leaf
    runs: the block seams (whose table the block's own hook brings in) still fuse; the
    attention processors, which read norm_q/norm_k's weights without calling them, take
    diffusers' path for the norms."""
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    if order == "offload_then_patch":
        accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
        assert model.transformer_blocks[0].attn1.norm_q.weight.device.type == "meta"
        report = kiln.patch(model)
    else:
        report = kiln.patch(model)
        accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert report.left == []
    counter = Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    assert counter.calls["adaln"] == 2 and counter.calls["gated_adaln"] == 2
    assert counter.calls["rms_norm_rope"] == 0 and counter.calls["rms_norm"] == 8  # the q/k norm modules
    assert counter.calls["gated_residual"] == 2 and counter.calls["gated_residual_"] == 2
    _agree(actual, expected, torch.float32)
    kiln.unpatch(model)
    assert torch.equal(_ltx_out(model, inputs), expected)


# ---- FLUX ------------------------------------------------------------------------------


def _flux(dtype, device="cpu"):
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=24, pooled_projection_dim=12, guidance_embeds=False,
        axes_dims_rope=(4, 6, 6)).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _norms_spread(model):
    """The model with a random spread on its norms' parameters (weights start at 1, biases at 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def _flux_inputs(dtype, device="cpu"):
    g = torch.Generator().manual_seed(3)
    s, t = 12, 5
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(3.0), torch.arange(4.0), indexing="ij"), -1)
    return dict(hidden_states=torch.randn(2, s, 8, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(2, t, 24, generator=g).to(device, dtype),
                pooled_projections=torch.randn(2, 12, generator=g).to(device, dtype),
                timestep=torch.tensor([0.3, 0.7]).to(device, dtype), img_ids=ids.reshape(s, 3).to(device),
                txt_ids=torch.zeros(t, 3, device=device), return_dict=False)


def _flux_out(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


# Without autograd: AdaLN 2 (double block) + 2 (single blocks) + 1 (output); the per-head q/k
# norms and the rotation one head_norm_rope a single block, and in the double block one in
# place per stream (text, image) on the joint concatenation; the double block's seams, a
# stream each: its gated residual and norm2 with the modulation (gated_adaln), its
# feed-forward's gelu and gated residual (gated_residual_); each single block's gelu
# (written into proj_out's input) and gated residual.
FLUX_FUSED = {"adaln": 5, "head_norm_rope": 2, "head_norm_rope_": 2, "gelu": 4, "gated_adaln": 2,
              "gated_residual_": 2, "gated_residual": 2}
# Recording a graph (head_norm_rope has no backward): one rope per attention, the per-head q/k
# norms as modules: 4 + 2 * 2.
FLUX_TRAINING = {"adaln": 5, "rope": 3, "rms_norm": 8, "layer_norm": 2, "gelu": 2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flux_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model = _flux(dtype)
    inputs = _flux_inputs(dtype)
    processors = _processors(model)
    expected = _flux_out(model, inputs)
    report = kiln.patch(model)
    kinds = {r.path: r.kind for r in report.replaced}
    assert kinds["transformer_blocks.0.norm1"] == kinds["transformer_blocks.0.norm1_context"] \
        == "adaln (layer norm, zero)"
    assert kinds["single_transformer_blocks.1.norm"] == "adaln (layer norm, zero single)"
    assert kinds["norm_out"] == "adaln (layer norm, continuous)"
    assert kinds["transformer_blocks.0.attn"] == "flux attention (per-head q/k rms_norm + rope)"
    assert kinds["single_transformer_blocks.0.attn"] == "flux attention (per-head q/k rms_norm + rope)"
    assert kinds["transformer_blocks.0"] == "flux double block (gated residual + norm seams)"
    assert kinds["single_transformer_blocks.1"] == "flux single block (gelu into proj_out's input, gated residual)"
    assert report.left == []
    counter = Counter(monkeypatch)
    actual = _flux_out(model, inputs)
    assert counter.used() == FLUX_FUSED
    _agree(actual, expected, dtype)
    assert kiln.unpatch(model) == len(report.replaced)
    assert _processors(model) == processors and _instance_forwards(model) == []
    assert all(type(p) is FluxAttnProcessor for p in processors.values())
    assert torch.equal(_flux_out(model, inputs), expected)


def test_flux_patch_leaves_the_global_generator_as_it_was():
    """As for transformers' models (test_patch_cpu.py): the block and attention probes' stand-in
    modules leave torch's global generator where it was."""
    model = _flux(torch.float32)
    torch.manual_seed(7)
    expected = torch.randn(8)
    torch.manual_seed(7)
    assert kiln.patch(model).left == []
    assert torch.equal(torch.randn(8), expected)


def test_flux_single_block_reads_adjacent_streams_without_concatenating():
    """A single block's text and image streams, as the previous single block returns them, are
    the two halves of its output: read as that tensor, not copied. Anything else is concatenated."""
    from kiln.patching.flux_block import joined

    out = torch.randn(2, 8, 6)
    assert joined(out[:, :3], out[:, 3:]) is out
    for c, h in [(out[:, 3:], out[:, :3]),  # swapped
                 (out[:, :3], out[:, 4:]),  # a gap
                 (out[:, :3, :4], out[:, 3:, :4]),  # narrower than the tensor
                 (out[:, :3].clone(), out[:, 3:]),
                 (out[:1, :3], out[:1, 3:])]:  # one sample of a batch
        both = joined(c, h)
        assert both is not out and torch.equal(both, torch.cat([c, h], dim=1))


def test_flux_blocks_run_diffusers_forward_where_kiln_would_differ(monkeypatch):
    """A hook on the double block's norm2, or on a single block's activation (either may change
    what the module computes): those blocks run diffusers' own forward, and the patched model
    still agrees. (A block that trains does too: test_flux_trains_through_kiln.)"""
    model = _flux(torch.float32)
    inputs = _flux_inputs(torch.float32)
    expected = _flux_out(model, inputs)
    kiln.patch(model)
    handle = model.transformer_blocks[0].norm2.register_forward_hook(lambda *args: None)
    model.single_transformer_blocks[0].act_mlp.register_forward_hook(lambda *args: None)
    counter = Counter(monkeypatch)
    _agree(_flux_out(model, inputs), expected, torch.float32)
    # The second single block still runs kiln's: one gelu and one gated residual.
    assert "gated_adaln" not in counter.used() and counter.used()["gated_residual"] == 1
    handle.remove()


def test_flux_head_norms_join_the_rotation_only_with_rms_norm_in_ops(monkeypatch):
    """ops=["rope"]: the attention's per-head q/k norms stay torch's own (as in transformers'
    attentions), and kiln rotates q and k."""
    model = _flux(torch.float32)
    inputs = _flux_inputs(torch.float32)
    expected = _flux_out(model, inputs)
    report = kiln.patch(model, ops=["rope"])
    kinds = {r.path: r.kind for r in report.replaced}
    assert kinds == {"transformer_blocks.0.attn": "flux attention (rope of q and k)",
                     "single_transformer_blocks.0.attn": "flux attention (rope of q and k)",
                     "single_transformer_blocks.1.attn": "flux attention (rope of q and k)"}
    counter = Counter(monkeypatch)
    actual = _flux_out(model, inputs)
    assert counter.used() == {"rope": 3}
    _agree(actual, expected, torch.float32)


def test_flux_trains_through_kiln(monkeypatch):
    """AdaLN and RoPE have backward formulas: with grad enabled FLUX's patched norms and
    attention stay on kiln, and loss and gradients match diffusers'."""
    model = _flux(torch.float32)
    inputs = _flux_inputs(torch.float32)
    expected, grads = _loss_grads(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = model(**inputs)[0]
    assert counter.used() == FLUX_TRAINING
    _agree(actual, expected, torch.float32)
    actual.pow(2).mean().backward()
    params = dict(model.named_parameters())
    for name, grad in grads.items():
        torch.testing.assert_close(params[name].grad, grad, rtol=1e-4, atol=1e-6, msg=name)


def test_flux_text_key_projection_alone_trains_through_kiln():
    """Only the joint attention's add_k_proj trains, so only the text stream's keys record a
    graph: the per-head norms and rotation must not run in place on them (head_norm_rope_
    has no backward), and the gradient matches diffusers'."""
    model = _flux(torch.float32).requires_grad_(False)
    model.transformer_blocks[0].attn.add_k_proj.weight.requires_grad_(True)
    _assert_one_parameter_trains_as_diffusers(model, _flux_inputs(torch.float32),
                                              "transformer_blocks.0.attn.add_k_proj.weight")


def _affine_adaln(dtype):
    """AdaLayerNormContinuous over a LayerNorm with a weight and a bias, both random."""
    from diffusers.models.normalization import AdaLayerNormContinuous

    module = AdaLayerNormContinuous(32, 16, elementwise_affine=True, eps=1e-6).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        module.norm.weight.copy_(1 + 0.3 * torch.randn(32, generator=g))
        module.norm.bias.copy_(0.3 * torch.randn(32, generator=g))
    return module.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adaln_with_an_affine_norm_folds_its_bias_into_the_shift(dtype, monkeypatch):
    """(x^ w + b) (1 + scale) + shift as one kiln.adaln of x^ w with the shift plus b (1 + scale):
    the bias costs a [B, D] product, not a pass over x."""
    module = _affine_adaln(dtype)
    g = torch.Generator().manual_seed(0)
    x, e = (torch.randn(3, 7, 32, generator=g) + 0.5).to(dtype), torch.randn(3, 16, generator=g).to(dtype)
    with torch.no_grad():
        expected = module(x, e)
        report = kiln.patch(module)
        assert [r.kind for r in report.replaced] == ["adaln (layer norm, continuous)", "layer_norm"]
        counter = Counter(monkeypatch)
        actual = module(x, e)
    assert counter.used() == {"adaln": 1}
    _agree(actual, expected, dtype)


def test_adaln_with_an_affine_norm_trains_its_weight_and_bias_through_kiln():
    module = _affine_adaln(torch.float32)
    g = torch.Generator().manual_seed(0)
    x, e = torch.randn(3, 7, 32, generator=g) + 0.5, torch.randn(3, 16, generator=g)

    def grads():
        module.zero_grad()
        module(x, e).pow(2).mean().backward()
        return {name: p.grad.clone() for name, p in module.named_parameters()}

    expected = grads()
    kiln.patch(module)
    actual = grads()
    assert set(actual) == {"linear.weight", "linear.bias", "norm.weight", "norm.bias"}
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-6, msg=name)


def _cogvideox(dtype, device="cpu", **config):
    """A tiny CogVideoX transformer, its norms' weights and biases random (they start at 1 and 0)."""
    torch.manual_seed(0)
    sizes = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=32,
                 text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
                 max_text_seq_length=8)
    model = diffusers.CogVideoXTransformer3DModel(**dict(sizes, **config)).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _cogvideox_inputs(dtype, device="cpu"):
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 2, 4, 8, 8, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 8, 32, generator=g).to(device, dtype),
                timestep=torch.tensor([10, 500], device=device), return_dict=False)


# Each block's norm1 (video and text an adaln each) and, a stream each, its attention's gated
# residual with norm2's modulation (gated_adaln) and its feed-forward's gated residual
# (gated_residual_); the output AdaLayerNorm; the attention's q/k LayerNorms and the final
# LayerNorm; the feed-forwards' GELU.
COGVIDEOX_CALLS = {"adaln": 5, "gated_adaln": 4, "gated_residual_": 4, "layer_norm": 5, "gelu": 2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cogvideox_modulated_norms_are_kiln_adaln(dtype, monkeypatch):
    """CogVideoX's CogVideoXLayerNormZero (an affine LayerNorm of the video and of the text
    tokens, one embedding's six chunks) and its output AdaLayerNorm (chunk_dim 1: shift first)
    are each one kiln.adaln a stream, the norm's bias folded into the shift; its blocks' seams
    are kiln.gated_adaln (the attention's gated residual and norm2) and kiln.gated_residual_."""
    model = _cogvideox(dtype)
    inputs = _cogvideox_inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds["transformer_blocks.0.norm1"] == kinds["transformer_blocks.1.norm2"] \
            == "adaln (layer norm, cogvideox video and text)"
        assert kinds["norm_out"] == "adaln (layer norm, shift scale)"
        assert kinds["transformer_blocks.1"] == "cogvideox block (gated residual + norm seams)"
        assert report.left == []
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == COGVIDEOX_CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


def test_cogvideox_block_is_left_to_inductor_under_torch_compile():
    """Compiled, a patched block runs diffusers' seams (Inductor fuses them with their
    neighbours) and its AdaLN modules stay kiln.adaln."""
    model = _cogvideox(torch.float32)
    inputs = _cogvideox_inputs(torch.float32)
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        compiled, graphs = compile_capturing(model.transformer_blocks[0])
        block_inputs = (torch.randn(2, 32, 32), torch.randn(2, 8, 32), torch.randn(2, 32))
        compiled(*block_inputs)
        assert calls_of(graphs, torch.ops.kiln.gated_adaln.default) == []
        assert len(calls_of(graphs, torch.ops.kiln.adaln.default)) == 4
        torch._dynamo.reset()
        _agree(model(**inputs)[0], expected, torch.float32)


def test_cogvideox_modulated_norm_bias_trains_through_kiln():
    model = _cogvideox(torch.float32).requires_grad_(False)
    model.transformer_blocks[0].norm1.norm.bias.requires_grad_(True)
    _assert_one_parameter_trains_as_diffusers(model, _cogvideox_inputs(torch.float32),
                                              "transformer_blocks.0.norm1.norm.bias")


@pytest.mark.parametrize("norm_type", ["layer_norm", "rms_norm"])
def test_adaln_continuous_norm_types(norm_type, monkeypatch):
    from diffusers.models.normalization import AdaLayerNormContinuous

    module = AdaLayerNormContinuous(32, 16, elementwise_affine=False, eps=1e-6, norm_type=norm_type).eval()
    g = torch.Generator().manual_seed(0)
    x, e = torch.randn(3, 7, 32, generator=g) + 0.5, torch.randn(3, 16, generator=g)
    with torch.no_grad():
        expected = module(x, e)
        report = kiln.patch(module)
        assert report.replaced[0].kind == f"adaln ({norm_type.split('_')[0]} norm, continuous)"
        counter = Counter(monkeypatch)
        actual = module(x, e)
    assert counter.calls["adaln"] == 1
    _agree(actual, expected, torch.float32)


# ---- the LTX VAE -----------------------------------------------------------------------


def _ltx_vae():
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 16),
        decoder_block_out_channels=(8, 16), layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1),
        spatio_temporal_scaling=(True, False), decoder_spatio_temporal_scaling=(True, False),
        decoder_inject_noise=(False, False, False), upsample_residual=(False, False), upsample_factor=(1, 1),
        patch_size=2, patch_size_t=1).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return vae


def test_ltx_vae_channel_norms(monkeypatch):
    """The VAE's RMSNorms run over channels after a movedim (a last dimension of stride
    T*H*W): recognised as RMSNorms by what they compute, and agree on that layout."""
    vae = _ltx_vae()
    x = torch.randn(1, 3, 5, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = vae(x).sample
        report = kiln.patch(vae)
        counter = Counter(monkeypatch)
        actual = vae(x).sample
        ops_by_path = {r.path: r.op for r in report.replaced}
        assert ops_by_path["encoder.down_blocks.0.resnets.0.norm1"] == "rms_norm"
        assert ops_by_path["decoder.norm_out"] == "rms_norm"
        assert report.left == []
        assert counter.calls["rms_norm"] == 18 and counter.calls["layer_norm"] == 2
        _agree(actual, expected, torch.float32)
        kiln.unpatch(vae)
        assert torch.equal(vae(x).sample, expected)


@pytest.mark.parametrize("family", ["ltx", "flux"])
def test_a_deep_copy_of_a_patched_transformer_computes_with_its_own_weights(family):
    """The patched blocks' and AdaLN modules' forwards of a copy (copy.deepcopy: an EMA copy
    of the transformer) are made for the copy."""
    import copy

    build, make_inputs, out = (_ltx, _ltx_inputs, _ltx_out) if family == "ltx" else (_flux, _flux_inputs, _flux_out)
    model = build(torch.float32)
    inputs = make_inputs(torch.float32)
    kiln.patch(model)
    before = out(model, inputs)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.1)
    actual = out(twin, inputs)
    assert torch.equal(out(model, inputs), before)
    kiln.unpatch(twin)
    _agree(actual, out(twin, inputs), torch.float32)
