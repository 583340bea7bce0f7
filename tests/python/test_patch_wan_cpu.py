"""kiln.patch on diffusers' Wan transformer (Wan 2.1 / 2.2): its self-attentions normalise and
rotate q and k in one kiln call (kiln.rms_norm_rope; with autograd, the norm modules and one
kiln.rope), reading the columns of diffusers' tables that diffusers' own rotation reads (cos at
even columns, sin at odd ones), and everything agrees with the unpatched model."""

import pytest
import torch

import kiln
from kiln.patching import wan

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
from diffusers.models.transformers.transformer_wan import WanAttnProcessor  # noqa: E402

from graph_model import calls_of, compile_capturing  # noqa: E402

try:
    import accelerate
except ImportError:
    accelerate = None
from test_patch_dit_cpu import (Counter, _agree, _assert_one_parameter_trains_as_diffusers,  # noqa: E402
                               _instance_forwards, _loss_grads, _processors)

LAYERS = 2


def _wan(dtype, device="cpu", cls="WanTransformer3DModel", **config):
    """A tiny Wan transformer (or diffusers' ``cls`` built on Wan's blocks) in `dtype`, with what
    diffusers' loader keeps in fp32 (the rotary tables, the time embedder, the modulation tables,
    the norms' parameters) in fp32."""
    torch.manual_seed(0)
    config = dict(dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                       out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=LAYERS, cross_attn_norm=True,
                       rope_max_seq_len=32), **config)
    model = getattr(diffusers, cls)(**config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "scale_shift_table" in name:
                p.add_(0.2 * torch.randn_like(p))
    model = model.to(device=device)
    # As diffusers' loader decides: by the parameter's or buffer's full name.
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if not any(k in name.split(".") for k in model._keep_in_fp32_modules):
            tensor.data = tensor.data.to(dtype)
    return model


def _wan_inputs(dtype, device="cpu", batch=2):
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(batch, 4, 3, 8, 6, generator=g).to(device, dtype),
                timestep=torch.tensor([500, 300][:batch]).to(device),
                encoder_hidden_states=torch.randn(batch, 7, 16, generator=g).to(device, dtype), return_dict=False)


def _wan_out(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def _attention_paths(report):
    return sorted(r.path for r in report.replaced if r.op in ("rope", "rms_norm_rope"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wan_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model = _wan(dtype)
    inputs = _wan_inputs(dtype)
    processors = _processors(model)
    expected = _wan_out(model, inputs)
    report = kiln.patch(model)
    # The self-attentions; the cross-attentions (called without tables) keep diffusers' processor.
    assert _attention_paths(report) == [f"blocks.{i}.attn1" for i in range(LAYERS)]
    assert {r.kind for r in report.replaced if r.path.endswith("attn1")} == {"wan attention (q/k rms_norm + rope)"}
    assert {r.path: r.op for r in report.replaced if r.path.count(".") == 1} == {
        f"blocks.{i}": "adaln + gated_adaln" for i in range(LAYERS)}
    assert report.left == []
    counter = Counter(monkeypatch)
    actual = _wan_out(model, inputs)
    # Block 0's norm1 AdaLN; two gated_adaln a block, and block 0's last residual with block
    # 1's norm1 (handed over); block 1's last residual as diffusers writes it.
    assert counter.used() == {"rms_norm_rope": LAYERS, "rms_norm": 2 * LAYERS, "adaln": 1,
                              "gated_adaln": 2 * LAYERS + LAYERS - 1, "gelu": LAYERS, "layer_norm": 1}
    _agree(actual, expected, dtype)
    assert kiln.unpatch(model) == len(report.replaced)
    assert _processors(model) == processors and _instance_forwards(model) == []
    assert all(type(p) is WanAttnProcessor for p in processors.values())
    assert torch.equal(_wan_out(model, inputs), expected)


@pytest.mark.parametrize("ops", [None, ["rope"]])
@pytest.mark.parametrize("batch_table", [1, 2])
def test_wan_rotation_reads_diffusers_columns_of_any_table(batch_table, ops, monkeypatch):
    """Tables whose cos and sin are unrelated at every column (not the duplicated pairs
    diffusers builds): the patched processor agrees only by reading the columns diffusers'
    rotation reads, fused with the norms or not (ops without rms_norm)."""
    model = _wan(torch.float32)
    attn = model.blocks[0].attn1
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 9, 24, generator=g)
    table = (torch.randn(batch_table, 9, 1, 12, generator=g), torch.randn(batch_table, 9, 1, 12, generator=g))
    with torch.no_grad():
        expected = attn(x, None, None, table)
        kiln.patch(model, ops=ops)
        counter = Counter(monkeypatch)
        actual = attn(x, None, None, table)
    assert counter.used() == ({"rms_norm_rope": 1} if ops is None else {"rope": 1})
    _agree(actual, expected, torch.float32)


def test_wan_half_tables_are_made_once_a_forward(monkeypatch):
    """Every block of a forward receives the same tables: their half tables are copied once,
    and again only for new tables or tables changed in place."""
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    expected = _wan_out(model, inputs)
    kiln.patch(model)
    made = []
    real = wan._halves
    monkeypatch.setattr(wan, "_halves", lambda cos, sin: made.append(1) or real(cos, sin))
    _agree(_wan_out(model, inputs), expected, torch.float32)
    assert len(made) == 1
    _wan_out(model, inputs)
    assert len(made) == 2
    attn = model.blocks[0].attn1
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 9, 24, generator=g)
    cos, sin = torch.randn(1, 9, 1, 12, generator=g), torch.randn(1, 9, 1, 12, generator=g)
    with torch.no_grad():
        before = attn(x, None, None, (cos, sin))
        cos.mul_(-1)
        after = attn(x, None, None, (cos, sin))
        kiln.unpatch(model)
        truth = attn(x, None, None, (cos, sin))
    assert len(made) == 4 and not torch.equal(before, after)
    _agree(after, truth, torch.float32)


def test_wan_trains_through_kiln(monkeypatch):
    """kiln.rope and kiln.rms_norm have backward formulas (rms_norm_rope has none): with grad
    enabled the norms run as modules and the rotation as kiln.rope, and loss and gradients
    match diffusers'."""
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    expected, grads = _loss_grads(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = model(**inputs)[0]
    assert counter.used()["rope"] == LAYERS and counter.used()["rms_norm"] == 4 * LAYERS
    assert "rms_norm_rope" not in counter.used()
    _agree(actual, expected, torch.float32)
    actual.pow(2).mean().backward()
    params = dict(model.named_parameters())
    for name, grad in grads.items():
        torch.testing.assert_close(params[name].grad, grad, rtol=1e-4, atol=1e-6, msg=name)


def test_wan_fused_projections():
    model = _wan(torch.float32)
    for block in model.blocks:
        block.attn1.fuse_projections()
        block.attn2.fuse_projections()
    inputs = _wan_inputs(torch.float32)
    expected = _wan_out(model, inputs)
    report = kiln.patch(model)
    assert _attention_paths(report) == [f"blocks.{i}.attn1" for i in range(LAYERS)]
    _agree(_wan_out(model, inputs), expected, torch.float32)


def test_wan_image_to_video_cross_attention_is_kept():
    """Wan's I2V model: the image context's own keys and values in the cross-attentions, which
    keep diffusers' processor; the self-attentions are patched."""
    model = _wan(torch.float32, image_dim=8, added_kv_proj_dim=24)
    inputs = _wan_inputs(torch.float32)
    inputs["encoder_hidden_states"] = torch.randn(2, 512, 16)
    inputs["encoder_hidden_states_image"] = torch.randn(2, 3, 8)
    expected = _wan_out(model, inputs)
    report = kiln.patch(model)
    assert _attention_paths(report) == [f"blocks.{i}.attn1" for i in range(LAYERS)]
    _agree(_wan_out(model, inputs), expected, torch.float32)


def test_wan_ops_filter_leaves_the_attention():
    model = _wan(torch.float32)
    report = kiln.patch(model, ops=["rms_norm"])
    left = {r.path: r.reason for r in report.left}
    assert left["blocks.0.attn1"] == "computes wan attention (q/k rms_norm + rope); rope is not in ops"
    assert _attention_paths(report) == []


def test_wan_norms_other_than_rms_norm_keep_the_modules(monkeypatch):
    """A q norm that is not an RMSNorm kiln computes (here a LayerNorm): the norms stay the
    modules, and kiln rotates."""
    model = _wan(torch.float32)
    for block in model.blocks:
        block.attn1.norm_q = torch.nn.LayerNorm(24, eps=1e-6)
    inputs = _wan_inputs(torch.float32)
    expected = _wan_out(model, inputs)
    report = kiln.patch(model)
    assert {r.kind for r in report.replaced if r.path.endswith("attn1")} == {"wan attention (rope of q and k)"}
    counter = Counter(monkeypatch)
    _agree(_wan_out(model, inputs), expected, torch.float32)
    assert counter.used()["rope"] == LAYERS and "rms_norm_rope" not in counter.used()


def test_wan_hooked_norm_keeps_the_module(monkeypatch):
    """A hook on a q/k norm (it may change the norm's output) keeps the norm a module call."""
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    kiln.patch(model)
    for block in model.blocks:
        block.attn1.norm_k.register_forward_hook(lambda m, args, out: out * 2)
    counter = Counter(monkeypatch)
    actual = _wan_out(model, inputs)
    assert counter.used()["rope"] == LAYERS and "rms_norm_rope" not in counter.used()
    kiln.unpatch(model)
    _agree(actual, _wan_out(model, inputs), torch.float32)


def test_wan_attention_computing_another_rotation_is_left():
    """A processor of the same name that rotates by another formula fails the probe."""
    model = _wan(torch.float32)

    class WanAttnProcessor:  # noqa: N801 - the name the candidate test reads
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     rotary_emb=None):
            q = attn.to_q(hidden_states)
            if rotary_emb is not None:
                q = q * rotary_emb[0].flatten(2)[..., :1]
            return attn.to_out[0](q)

    WanAttnProcessor.__module__ = "diffusers.models.transformers.transformer_wan"
    WanAttnProcessor.__call__.__qualname__ = "WanAttnProcessor.__call__"
    model.blocks[0].attn1.set_processor(WanAttnProcessor())
    report = kiln.patch(model)
    left = {r.path: r.reason for r in report.left}
    assert left["blocks.0.attn1"].startswith("does not compute Wan's attention as kiln's processor does")
    assert _attention_paths(report) == ["blocks.1.attn1"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wan_whole_model_compile(dtype):
    """torch.compile of the whole patched model traces kiln.rms_norm_rope once a block and the
    seams (no graph break; in bf16 with the fp32 modulation tables, through the fakes), the
    half tables sliced inside the graph."""
    model = _wan(dtype)
    inputs = _wan_inputs(dtype)
    expected = _wan_out(model, inputs)
    kiln.patch(model)
    compiled, graphs = compile_capturing(model)
    with torch.no_grad():
        actual = compiled(**inputs)[0]
    torch._dynamo.reset()
    assert len(graphs) == 1 and len(calls_of(graphs, torch.ops.kiln.rms_norm_rope.default)) == LAYERS
    # No hand-over while compiling: each block's norm1 AdaLN is its own.
    assert len(calls_of(graphs, torch.ops.kiln.adaln.default)) == LAYERS
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 2 * LAYERS
    _agree(actual, expected, dtype)
    kiln.unpatch(model)


# ---- the block seams ---------------------------------------------------------------------


def test_wan_per_token_modulation(monkeypatch):
    """Wan 2.2's per-token timesteps (temb [B, S, 6, D]): the seams read per-token operands."""
    model = _wan(torch.bfloat16)
    inputs = _wan_inputs(torch.bfloat16)
    inputs["timestep"] = torch.randint(0, 1000, (2, 3 * 4 * 3))
    expected = _wan_out(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = _wan_out(model, inputs)
    assert counter.used()["adaln"] == 1 and counter.used()["gated_adaln"] == 2 * LAYERS + LAYERS - 1
    _agree(actual, expected, torch.bfloat16)


def test_wan_block_trains_through_diffusers_seams(monkeypatch):
    """gated_adaln has no backward and the fp32 table rows none either: with grad enabled the
    blocks run diffusers' forward, and loss and gradients match."""
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    expected, grads = _loss_grads(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = model(**inputs)[0]
    assert "adaln" not in counter.used() and "gated_adaln" not in counter.used()
    _agree(actual, expected, torch.float32)
    actual.pow(2).mean().backward()
    params = dict(model.named_parameters())
    for name, grad in grads.items():
        torch.testing.assert_close(params[name].grad, grad, rtol=1e-4, atol=1e-6, msg=name)


def test_wan_norm2_changed_after_patch_is_read_again():
    """norm2's weight and bias reach the fused seam as table rows kept between calls; a weight
    changed in place (a LoRA merge, a loaded state dict) is read again."""
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    kiln.patch(model)
    _wan_out(model, inputs)
    with torch.no_grad():
        for block in model.blocks:
            block.norm2.weight.mul_(1.5)
            block.norm2.bias.add_(0.25)
    actual = _wan_out(model, inputs)
    kiln.unpatch(model)
    _agree(actual, _wan_out(model, inputs), torch.float32)


def test_wan_hook_on_the_next_block_stops_the_hand_over(monkeypatch):
    """A forward pre-hook on block 1 may change its input: block 0 then ends with diffusers'
    residual formula and block 1 normalises its own input."""
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    model.blocks[1].register_forward_pre_hook(lambda m, args: (args[0] * 1.25,) + tuple(args[1:]))
    expected = _wan_out(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    actual = _wan_out(model, inputs)
    assert counter.used()["adaln"] == LAYERS and counter.used()["gated_adaln"] == 2 * LAYERS
    _agree(actual, expected, torch.float32)


def test_wan_block_without_a_cross_attention_norm_is_left():
    model = _wan(torch.float32)
    model.blocks[0].norm2 = torch.nn.Identity()
    report = kiln.patch(model)
    left = {r.path: r.reason for r in report.left}
    assert left["blocks.0"] == "its norm2 is not a LayerNorm over the hidden size"
    assert "blocks.1" in {r.path for r in report.replaced}


def test_wan_block_ops_filter():
    model = _wan(torch.float32)
    report = kiln.patch(model, ops=["rope", "rms_norm"])
    left = {r.path: r.reason for r in report.left}
    assert left["blocks.0"] == "computes wan block (adaln, gated residual + norm seams); adaln is not in ops"


def test_wan_norm2_replaced_after_patch_is_read_again():
    """A norm2 parameter replaced by a new tensor (not changed in place) is read again."""
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    kiln.patch(model)
    _wan_out(model, inputs)
    for block in model.blocks:
        block.norm2.weight = torch.nn.Parameter(block.norm2.weight.detach() * 0.5, requires_grad=False)
        block.norm2.bias = torch.nn.Parameter(block.norm2.bias.detach() - 0.5, requires_grad=False)
    actual = _wan_out(model, inputs)
    kiln.unpatch(model)
    _agree(actual, _wan_out(model, inputs), torch.float32)


def test_wan_under_inference_mode(monkeypatch):
    """Inference tensors keep no version counter: no hand-over between blocks and no half
    tables kept between calls, and the fused seams still run."""
    model = _wan(torch.bfloat16)
    inputs = _wan_inputs(torch.bfloat16)
    expected = _wan_out(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    with torch.inference_mode():
        actual = model(**inputs)[0]
    assert counter.used()["rms_norm_rope"] == LAYERS
    assert counter.used()["adaln"] == LAYERS and counter.used()["gated_adaln"] == 2 * LAYERS
    _agree(actual, expected, torch.bfloat16)


def test_wan_cross_attention_lora_trains_through_diffusers_seams():
    """Training only attn2 (a LoRA on the cross-attention) of a bf16 model with fp32 tables:
    the blocks run diffusers' forward, and the gradients match."""
    model = _wan(torch.bfloat16).requires_grad_(False)
    for block in model.blocks:
        block.attn2.to_q.weight.requires_grad_(True)
    inputs = _wan_inputs(torch.bfloat16)
    expected, grads = _loss_grads(model, inputs)
    kiln.patch(model)
    actual = model(**inputs)[0]
    _agree(actual, expected, torch.bfloat16)
    actual.float().pow(2).mean().backward()
    params = dict(model.named_parameters())
    assert grads
    for name, grad in grads.items():
        torch.testing.assert_close(params[name].grad, grad, rtol=2e-2, atol=1e-3, msg=name)


def test_wan_fine_tune_of_a_later_block_trains_through_diffusers_seams():
    """Only block 1's scale_shift_table trains: block 0, which records nothing itself, must
    not hand block 1's table rows to its gated_adaln (no backward), and the gradient reaches
    the table as diffusers' does."""
    model = _wan(torch.float32).requires_grad_(False)
    model.blocks[1].scale_shift_table.requires_grad_(True)
    _assert_one_parameter_trains_as_diffusers(model, _wan_inputs(torch.float32),
                                              "blocks.1.scale_shift_table", atol=1e-7)


def test_wan_cast_whole_to_bf16_keeps_norm2_exact():
    """A model cast whole to bf16 (tables and norm2 too, which diffusers warns of but runs):
    norm2's small weights reach the seam exactly (its rows are fp32), so the patched model
    agrees with diffusers' as closely as with fp32 tables."""
    model = _wan(torch.float32)
    with torch.no_grad():
        for block in model.blocks:
            block.norm2.weight.copy_(0.01 + 0.04 * torch.rand(24))
    model = model.to(torch.bfloat16)
    inputs = _wan_inputs(torch.bfloat16)
    expected = _wan_out(model, inputs)
    kiln.patch(model)
    actual = _wan_out(model, inputs)
    scale = expected.double().abs().max().item()
    assert (actual.double() - expected.double()).abs().max().item() <= 4 * 2**-8 * scale


@pytest.mark.skipif(accelerate is None, reason="accelerate is not installed")
def test_wan_sequential_cpu_offload():
    """accelerate's cpu_offload after the patch leaves each leaf's weights on the meta device
    until its hook runs: the blocks, which would read norm2's weight without calling it, run
    diffusers' forward, and the output is the unpatched one."""
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    expected = _wan_out(model, inputs)
    kiln.patch(model)
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    _agree(_wan_out(model, inputs), expected, torch.float32)


def test_wan_hook_on_a_norm_after_patch_runs(monkeypatch):
    model = _wan(torch.float32)
    inputs = _wan_inputs(torch.float32)
    kiln.patch(model)
    calls = []
    model.blocks[0].norm3.register_forward_hook(lambda m, args, out: calls.append(1) or out * 2)
    actual = _wan_out(model, inputs)
    assert calls == [1]
    kiln.unpatch(model)
    _agree(actual, _wan_out(model, inputs), torch.float32)


def test_wan_half_tables_go_with_their_forward():
    """The half tables are kept only while their source tables live."""
    import gc

    model = _wan(torch.float32)
    kiln.patch(model)
    _wan_out(model, _wan_inputs(torch.float32))
    gc.collect()
    assert wan._HALF_TABLES.entry is None
