"""kiln prewarm with no GPU: from lists, from Hugging Face config.json files, from a recorded
manifest; the prewarmed binaries are what a later compile of the same specialisation finds."""

import json
import os
import shutil
import subprocess

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
from cache_helpers import entry_files

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
         "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0}
QWEN2 = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
         "num_attention_heads": 28, "rope_theta": 1000000.0}
MISTRAL = {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
           "num_attention_heads": 32, "head_dim": 128}
LTX = {"_class_name": "LTXVideoTransformer3DModel", "attention_head_dim": 64,
       "num_attention_heads": 32, "cross_attention_dim": 2048, "num_layers": 28}
FLUX = {"_class_name": "FluxTransformer2DModel", "attention_head_dim": 128,
        "num_attention_heads": 24, "axes_dims_rope": [16, 56, 56]}
WAN = {"_class_name": "WanTransformer3DModel", "attention_head_dim": 128, "num_attention_heads": 12,
       "ffn_dim": 8960, "qk_norm": "rms_norm_across_heads", "cross_attn_norm": True}


class KilnCalls(TorchDispatchMode):
    """Within it, every kiln op call as its dispatcher sees it: a set of (op name, args)."""

    def __enter__(self):
        super().__enter__()
        self.calls = set()
        return self.calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "kiln":
            self.calls.add((func.__name__.split(".")[0], args))
        return func(*args, **(kwargs or {}))


def modulation_flags(op, args) -> int:
    """The flags kiln's host keys an adaln or gated_adaln call by, from the arguments its
    dispatcher saw (trailing defaults left out): the norm's weight (1), a LayerNorm (4), table
    rows (16; fp32 rows beside 16-bit activations, 16 | 128), an operand per token (32)."""
    first = 3 if op == "adaln" else 5  # the weight; then eps, the norm, the table rows
    given = tuple(args) + (None,) * (first + 6 - len(args))
    weight, norm, rows = given[first], given[first + 2], given[first + 3:]
    operands = args[1:3] if op == "adaln" else args[2:5]
    return ((1 if weight is not None else 0) | (4 if norm == "layer" else 0)
            | (16 if any(r is not None for r in rows) else 0) | (32 if any(t.shape[1] != 1 for t in operands) else 0)
            | (128 if any(r is not None and r.dtype != args[0].dtype for r in rows) else 0))


def gated_residual_flags(op, args) -> int:
    """The flags of a gated_residual(_) call: a gate per sample (8), in place (16)."""
    x, gate = args[0], args[2]
    return (8 if gate.shape == (x.shape[0], 1, x.shape[-1]) else 0) | (16 if op == "gated_residual_" else 0)


def seam_problem(op, args):
    """(op, width, flags) of an adaln, gated_adaln or gated_residual(_) call as kiln's host keys
    it (the gated residual's both forms under one op), or None for any other op."""
    if op in ("adaln", "gated_adaln"):
        return op, args[0].shape[-1], modulation_flags(op, args)
    if op in ("gated_residual", "gated_residual_"):
        return "gated_residual", args[0].shape[-1], gated_residual_flags(op, args)
    return None


def dit_problem(op, args):
    """(op, width, flags) of a patched diffusion transformer's seam (seam_problem), norm (the
    weight 1, the bias 2) or tanh/erf GELU call (a flat row 1; written into a slice, "gelu out",
    0), or None for any other op (its rotation's and feed-forward's: each model's test reads
    those)."""
    if (seam := seam_problem(op, args)) is not None:
        return seam
    x = args[0]
    if op in ("rms_norm", "layer_norm"):
        weight, bias = (tuple(args[1:3]) + (None, None))[:2] if op == "layer_norm" else (args[1], None)
        return op, x.shape[-1], (1 if weight is not None else 0) | (2 if bias is not None else 0)
    if op in ("gelu", "gelu out"):
        assert tuple(args[1:3]) in ((), (None,), (None, "tanh"), (None, "none"))  # trailing defaults left out
        return "gelu", x.shape[-1], 1 if op == "gelu" else 0
    return None


def assert_prewarmed(taken):
    """Each (op, width, flags) a patched model called is in the cache its config's prewarm filled."""
    for op, width, flags in taken:
        assert kiln.compile(op, "bf16", width, arch="sm_90", format="cubin", flags=flags)["from_cache"], \
            (op, width, flags)


def _prewarmed_and_patched(tmp_path, cls, **config):
    """A tiny diffusers ``cls`` of ``config`` in bf16, its config.json prewarmed (no failure), then
    patched; skipped where diffusers lacks ``cls``."""
    import torch
    diffusers = pytest.importorskip("diffusers")
    if not hasattr(diffusers, cls):
        pytest.skip(f"this diffusers has no {cls}")
    torch.manual_seed(0)
    model = getattr(diffusers, cls)(**config).eval().to(torch.bfloat16)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"_class_name": cls, **model.config}))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    kiln.patch(model)
    return model


@pytest.fixture
def fresh_cache(tmp_path):
    before = kiln.settings()
    cache = tmp_path / "cache"
    kiln.configure(cache_dir=str(cache), cache="rw")
    yield cache
    kiln.configure(cache_dir=before["cache_dir"], cache=before["cache_mode"])


def test_lists_compile_then_reuse(fresh_cache):
    first = kiln.prewarm("rms_norm", "bf16,fp16", [2048, 4096], "sm_75,sm_90", jobs=2)
    # rms_norm's common problems are with and without a weight: 2 x 2 dtypes x 2 sizes x 2 archs,
    # each with two binaries: its heuristic config and the one for calls of a row per SM or
    # fewer (the counts are binaries, the targets specialisations).
    assert first["targets"] == 16 and first["compiled"] == 32 and first["failed"] == 0
    assert len(entry_files(fresh_cache)) == 32
    again = kiln.prewarm("rms_norm", "bf16,fp16", [2048, 4096], "sm_75,sm_90", jobs=2)
    assert again["reused"] == 32 and again["compiled"] == 0
    hit = kiln.compile("rms_norm", "fp16", 4096, arch="sm_90", format="cubin", weight=False)
    assert hit["from_cache"]


def test_unregistered_ops_are_skipped_with_a_note(fresh_cache):
    result = kiln.prewarm(["rms_norm", "rope"], "bf16", 128, "sm_80")
    assert result["failed"] == 0
    skipped = any("rope" in note and "not registered" in note for note in result["notes"])
    # rms_norm alone gives 2 targets (with and without weight); a registered rope adds more.
    assert (skipped and result["compiled"] == 2) or (not skipped and result["compiled"] > 2)


@pytest.mark.parametrize("config,sizes", [
    (LLAMA, {"rms_norm": 4096}), (QWEN2, {"rms_norm": 3584}), (MISTRAL, {"rms_norm": 5120}),
    (LTX, {"rms_norm": 2048}), (FLUX, {"rms_norm": 128}), (WAN, {"rms_norm": 1536, "gelu": 8960})])
def test_hugging_face_configs_map_to_sizes(fresh_cache, tmp_path, config, sizes):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))
    assert result["failed"] == 0 and result["compiled"] >= 2, result
    for op, hidden in sizes.items():
        assert kiln.compile(op, "bf16", hidden, arch="sm_80", format="cubin")["from_cache"]


def test_a_models_head_counts_choose_its_rope_kernel(fresh_cache, tmp_path):
    # RoPE's kernel groups a thread's heads when q's and k's head counts allow it (flags 16:
    # both even, 32: both in fours), so a call's problem carries them. A prewarm from a
    # config takes the model's counts; from an op list, counts in fours.
    def prewarmed(flags):
        return kiln.compile("rope", "bf16", 128, arch="sm_80", format="cubin",
                            flags=flags)["from_cache"]

    gemma = {"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384,
             "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(LLAMA, num_key_value_heads=2)))
    assert kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))["failed"] == 0
    # transformers' layouts (heads inner as its attentions hand q and k over, and positions
    # inner, 8) with both counts even: grouped at the heuristic's 2 rows a thread, where
    # counts that are not even take the general kernel.
    assert prewarmed(16) and prewarmed(8 | 16) and not prewarmed(8)
    path.write_text(json.dumps(gemma))
    assert kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))["failed"] == 0
    assert kiln.compile("rope", "bf16", 256, arch="sm_80", format="cubin", flags=8)["from_cache"]
    listed = kiln.prewarm("rope", "bf16", 64, "sm_80")
    assert listed["failed"] == 0 and listed["compiled"] > 0
    assert kiln.compile("rope", "bf16", 64, arch="sm_80", format="cubin",
                        flags=8 | 16 | 32)["from_cache"]


def test_flux_prewarms_the_rotation_its_patched_attention_calls(fresh_cache, tmp_path):
    # kiln's FLUX processor calls head_norm_rope (flags 256) with diffusers' fp32 table,
    # interleaved (1 + 2), 24 + 24 heads (48), and kiln.rope the same way when training; FLUX
    # computes its angles into a table, so nothing calls rope_3d.
    path = tmp_path / "config.json"
    path.write_text(json.dumps(FLUX))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    for flags in (1 | 2 | 48 | 256, 1 | 2 | 48):
        assert kiln.compile("rope", "bf16", 128, arch="sm_90", format="cubin", flags=flags)["from_cache"]
    # Its patched blocks: the double blocks' seams (gated_adaln over a LayerNorm, flags 4, with
    # per-sample operands) and the single blocks' activation written into a slice (gelu, not
    # flat: flags 0).
    assert kiln.compile("gated_adaln", "bf16", 3072, arch="sm_90", format="cubin", flags=4)["from_cache"]
    assert kiln.compile("gelu", "bf16", 12288, arch="sm_90", format="cubin", flags=0)["from_cache"]


def test_video_transformers_prewarm_the_seams_their_patched_blocks_call(fresh_cache, tmp_path):
    # LTX-Video's blocks: AdaLN over an RMSNorm with the table rows beside temb (flags 16),
    # per sample for text to video and per token (32) where frames are conditioned; its
    # attention's q/k norms and rotation with the angles from the video grid (rms_norm_rope
    # flags 1); its output LayerNorm with no affine (flags 0).
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LTX))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    for op in ("adaln", "gated_adaln"):
        for flags in (16, 16 | 32):
            assert kiln.compile(op, "bf16", 2048, arch="sm_90", format="cubin", flags=flags)["from_cache"]
    assert kiln.compile("rms_norm_rope", "bf16", 2048, arch="sm_90", format="cubin", flags=1)["from_cache"]
    assert kiln.compile("layer_norm", "bf16", 2048, arch="sm_90", format="cubin", flags=0)["from_cache"]
    # Wan's: over a LayerNorm (4) from fp32 tables (16 | 128); the fused q/k norms and rotation
    # from diffusers' fp32 tables read as half tables of the head dim; the output norm in fp32.
    path.write_text(json.dumps(WAN))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    for op in ("adaln", "gated_adaln"):
        assert kiln.compile(op, "bf16", 1536, arch="sm_90", format="cubin", flags=4 | 16 | 128)["from_cache"]
    assert kiln.compile("rms_norm_rope", "bf16", 1536, arch="sm_90", format="cubin", flags=2,
                        aux=128)["from_cache"]
    assert kiln.compile("layer_norm", "fp32", 1536, arch="sm_90", format="cubin", flags=0)["from_cache"]


def test_qwen3_prewarms_its_head_norms_fused_and_alone(fresh_cache, tmp_path):
    # kiln's patched Qwen3 attention calls head_norm_rope (flags 256) on q and k as its
    # projections hand them over (halves, a bf16 table, [B, S, H, D] memory: no layout flag),
    # 32 + 8 heads (16 | 32); with autograd, the head norms (RMSNorm of 128) and kiln.rope.
    qwen3 = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(qwen3))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    for flags in (16 | 32 | 256, 16 | 32):
        assert kiln.compile("rope", "bf16", 128, arch="sm_90", format="cubin", flags=flags)["from_cache"]
    for hidden in (4096, 128):
        assert kiln.compile("rms_norm", "bf16", hidden, arch="sm_90", format="cubin")["from_cache"]
    # Llama's attention has no head norms: nothing fused is prewarmed for it.
    path.write_text(json.dumps(LLAMA))
    assert kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))["failed"] == 0
    assert not kiln.compile("rope", "bf16", 128, arch="sm_80", format="cubin", flags=16 | 32 | 256)["from_cache"]


def test_a_partial_rotation_prewarms_the_rotary_dim_its_calls_take(fresh_cache, tmp_path):
    # RoPE's kernels specialise on the rotary dim (a call's problem carries it as aux): Qwen3-
    # Next rotates the first 64 of its 256 head columns (partial_rotary_factor 0.25) after its
    # per-head norms, fused (flags 256) with 16 + 2 heads (both even: 16), and its shared
    # expert is a SwiGLU of 512; Phi-4-mini rotates 96 of 128, 24 + 8 heads (16 | 32).
    qwen3_next = {"model_type": "qwen3_next", "hidden_size": 2048, "intermediate_size": 5120,
                  "shared_expert_intermediate_size": 512, "num_attention_heads": 16,
                  "num_key_value_heads": 2, "head_dim": 256, "partial_rotary_factor": 0.25}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(qwen3_next))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    for flags in (16 | 256, 16):
        assert kiln.compile("rope", "bf16", 256, arch="sm_90", format="cubin", flags=flags,
                            aux=64)["from_cache"]
        assert not kiln.compile("rope", "bf16", 256, arch="sm_90", format="cubin", flags=flags,
                                aux=0)["from_cache"]
    assert kiln.compile("swiglu", "bf16", 512, arch="sm_90", format="cubin", flags=1)["from_cache"]
    assert kiln.compile("rms_norm", "bf16", 256, arch="sm_90", format="cubin")["from_cache"]
    phi4_mini = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
                 "num_attention_heads": 24, "num_key_value_heads": 8, "partial_rotary_factor": 0.75}
    path.write_text(json.dumps(phi4_mini))
    assert kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))["failed"] == 0
    assert kiln.compile("rope", "bf16", 128, arch="sm_80", format="cubin", flags=16 | 32,
                        aux=96)["from_cache"]
    # A multimodal config (Qwen3.5's) is read from its text_config.
    qwen3_5 = {"model_type": "qwen3_5", "text_config": dict(qwen3_next, model_type="qwen3_5_text",
                                                            hidden_size=2560, head_dim=128)}
    path.write_text(json.dumps(qwen3_5))
    assert kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))["failed"] == 0
    assert kiln.compile("rope", "bf16", 128, arch="sm_80", format="cubin", flags=16 | 256,
                        aux=32)["from_cache"]
    assert kiln.compile("rms_norm", "bf16", 2560, arch="sm_80", format="cubin")["from_cache"]


def test_models_that_hand_rope_another_table_prewarm_it(fresh_cache, tmp_path):
    # As kiln's patch calls kiln.rope for them: GPT-OSS a [.., D / 2] table, one angle a pair
    # (flag 128), 64 + 8 heads (16 | 32); GLM-4 interleaved pairs (1) from half its table
    # (128) over the first 64 of 128 columns, 32 + 2 heads (16); Phi-2 a 32-column slice of
    # each 80-column head, rotated as a whole head, 32 + 32 heads (16 | 32).
    models = [
        ({"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
          "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64}, 64, 128 | 16 | 32, 0),
        ({"model_type": "glm4", "hidden_size": 4096, "intermediate_size": 13696,
          "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
          "partial_rotary_factor": 0.5}, 128, 1 | 128 | 16, 64),
        ({"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
          "num_attention_heads": 32, "partial_rotary_factor": 0.4}, 32, 16 | 32, 0),
    ]
    path = tmp_path / "config.json"
    for config, width, flags, aux in models:
        path.write_text(json.dumps(config))
        assert kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))["failed"] == 0
        for layout in (0, 8):  # q and k as the attention hands them over, and contiguous
            assert kiln.compile("rope", "bf16", width, arch="sm_80", format="cubin",
                                flags=flags | layout, aux=aux)["from_cache"], config["model_type"]


def test_gpt_oss_prewarms_its_experts_clamped_gate(fresh_cache, tmp_path):
    # kiln's patch gates GPT-OSS's experts with clamped_swiglu over interleaved pairs (128), each
    # routed token's packed row back to back (flat, 1) or rows apart; no SwiGLU is called.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
                                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64}))
    assert kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))["failed"] == 0
    for flags in (128 | 1, 128):
        assert kiln.compile("clamped_swiglu", "bf16", 2880, arch="sm_80", format="cubin", flags=flags)["from_cache"]
    assert not kiln.compile("swiglu", "bf16", 2880, arch="sm_80", format="cubin", flags=1)["from_cache"]


def test_training_adds_the_backward_kernels(fresh_cache, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    inference = kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path))
    training = kiln.prewarm(dtypes="bf16", archs="sm_80", config=str(path), training=True)
    # Llama's ops and their backward: rms_norm_backward (with a trained weight, a frozen one as
    # LoRA trains, and none), the fused residual's (trained and frozen: 2), the partial sums
    # of both (one kernel: the sums know no op), swiglu_backward (two tensors, packed: 2),
    # RoPE's inverse rotation (4: transformers' two layouts, diffusers' two). Each pair of RoPE
    # layouts shares one kernel (the walk is a launch parameter), so 10 are compiled and the
    # other three reuse one of them.
    assert training["targets"] == inference["targets"] + 13, training
    assert training["reused"] == inference["compiled"] + inference["reused"] + 3
    assert training["compiled"] == 10
    assert training["failed"] == 0
    # An op list: each op's backward at the same sizes, once even when also listed.
    listed = kiln.prewarm(["layer_norm", "layer_norm_backward", "gelu"], "bf16", 3072, "sm_90",
                          training=True)
    alone = kiln.prewarm(["layer_norm", "gelu"], "bf16", 3072, "sm_90")
    backward = kiln.prewarm(["layer_norm_backward", "gelu_backward"], "bf16", 3072, "sm_90")
    assert listed["targets"] == alone["targets"] + backward["targets"], listed
    assert listed["failed"] == 0


def test_bad_config_names_the_key(tmp_path, fresh_cache):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    with pytest.raises(RuntimeError, match="intermediate_size"):
        kiln.prewarm(archs="sm_80", config=str(path))


def test_unreadable_config_is_named(tmp_path, fresh_cache):
    missing = tmp_path / "absent.json"
    with pytest.raises(RuntimeError, match="cannot open .*absent.json"):
        kiln.prewarm(archs="sm_80", config=str(missing))
    garbled = tmp_path / "config.json"
    garbled.write_text('{"model_type": "llama", "hidden_size": ')
    with pytest.raises(RuntimeError, match="config.json is not JSON"):
        kiln.prewarm(archs="sm_80", config=str(garbled))


def test_a_model_or_pipeline_folder_names_its_config(tmp_path, fresh_cache):
    # A checkpoint's folder: its config.json. A diffusers pipeline's folder (model_index.json,
    # no config.json of its own): its transformer's.
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA))
    assert kiln.prewarm(archs="sm_80", ops="rms_norm", config=str(model))["failed"] == 0
    assert kiln.compile("rms_norm", "bf16", 4096, arch="sm_80", format="cubin")["from_cache"]
    pipeline = tmp_path / "flux-pipeline"
    (pipeline / "transformer").mkdir(parents=True)
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline",
                                                           "transformer": ["diffusers", "FluxTransformer2DModel"]}))
    (pipeline / "transformer" / "config.json").write_text(json.dumps(dict(FLUX, num_attention_heads=20)))
    assert kiln.prewarm(archs="sm_80", ops="gated_adaln", config=str(pipeline))["failed"] == 0
    assert kiln.compile("gated_adaln", "bf16", 2560, arch="sm_80", format="cubin", flags=4)["from_cache"]
    # A pipeline without a transformer (an SDXL UNet's) is named as the file that is not there.
    (pipeline / "transformer" / "config.json").unlink()
    with pytest.raises(RuntimeError, match="cannot open .*transformer.config.json"):
        kiln.prewarm(archs="sm_80", config=str(pipeline))


def test_manifest_replay(fresh_cache, tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    records = [{"op": "rms_norm", "dtype": "bf16", "hidden": 1536, "flags": 1, "align": 16,
                "aux": 0, "arch": "sm_80"},
               {"op": "rms_norm", "dtype": "fp16", "hidden": 999, "flags": 0, "align": 2,
                "aux": 0, "arch": "sm_90"}]
    manifest.write_text("\n".join(json.dumps(r) for r in records) + "\n{\"torn\": \n")
    result = kiln.prewarm(manifest=str(manifest))
    assert result["compiled"] == 4 and result["failed"] == 0  # each with its few-rows config
    assert any("skipped 1 line" in note for note in result["notes"])
    assert kiln.compile("rms_norm", "bf16", 1536, arch="sm_80", format="cubin")["from_cache"]


def kiln_cli():
    """The kiln command of this build: KILN_CLI, else `kiln` on PATH when it has prewarm (an
    older installed copy on PATH is not the one under test)."""
    cli = os.environ.get("KILN_CLI") or shutil.which("kiln")
    if cli and not os.environ.get("KILN_CLI"):
        probe = subprocess.run([cli, "--help"], capture_output=True, text=True, timeout=60)
        cli = cli if "prewarm" in probe.stdout else None
    return cli


@pytest.mark.skipif(kiln_cli() is None,
                    reason="no kiln command of this build (set KILN_CLI or put it on PATH)")
def test_cli_prewarm_and_cache_commands(tmp_path):
    cache, bundle, other = tmp_path / "c", tmp_path / "bundle", tmp_path / "other"
    cli = kiln_cli()

    def run(*args, env_cache=cache):
        env = dict(os.environ, KILN_CACHE_DIR=str(env_cache))
        return subprocess.run([cli, *args], env=env, capture_output=True, text=True, timeout=300)

    out = run("prewarm", "--op", "rms_norm", "--dtype", "bf16,fp16", "--hidden", "2048",
              "--arch", "sm_80,sm_90", "-j", "2")
    assert out.returncode == 0, out.stderr
    assert "compiled 16, reused 0, failed 0" in out.stdout  # 8 targets, 2 binaries each
    assert "reused 16" in run("prewarm", "--op", "rms_norm", "--dtype", "bf16,fp16", "--hidden",
                             "2048", "--arch", "sm_80,sm_90").stdout
    # --training adds rms_norm_backward's three problems (trained, frozen and no weight) and
    # the trained weight's partial sums per dtype and arch, one binary each
    assert "compiled 32, reused 0" in run("prewarm", "--op", "rms_norm", "--dtype", "bf16,fp16",
                                          "--hidden", "2048", "--arch", "sm_80,sm_90",
                                          "--training", env_cache=tmp_path / "t").stdout
    # `kiln compile --rows` names the heuristic those rows get, as kiln.compile(rows=) does
    compiled = run("compile", "--op", "rms_norm", "--hidden", "4096", "--arch", "sm_90",
                   "--rows", "8", env_cache=tmp_path / "compile")
    assert compiled.returncode == 0, compiled.stderr
    expected = kiln.compile("rms_norm", "bf16", 4096, arch="sm_90", rows=8)["config"]
    assert f"config {expected} " in compiled.stderr + compiled.stdout
    stats = json.loads(run("cache", "stats", "--json").stdout)
    assert stats["compiles"] == 16 and stats["binaries"] == 16
    assert "16 binaries" in run("cache", "ls").stdout
    assert run("cache", "verify").returncode == 0
    assert "exported 24 entries" in run("cache", "export", str(bundle)).stdout  # 16 bins + 8 records
    assert "imported 24 entries" in run("cache", "import", str(bundle), env_cache=other).stdout
    trimmed = run("cache", "trim", "--max-size", "20K")
    assert trimmed.returncode == 0 and "kept" in trimmed.stdout
    assert sum(e["bytes"] for e in kiln.cache_ls(str(cache))) <= 20 * 1024
    assert run("cache", "clear").returncode == 0
    assert kiln.cache_ls(str(cache)) == []
    no_arch = run("prewarm", "--op", "rms_norm", "--hidden", "64")
    if kiln.device_count() == 0:
        assert no_arch.returncode != 0 and "--arch" in no_arch.stderr
    else:  # with a GPU, no --arch means the GPU's arch
        assert no_arch.returncode == 0 and "compiled 4," in no_arch.stdout, no_arch.stderr


def test_falcon_h1_prewarms_the_gated_norm_its_mixer_has(fresh_cache, tmp_path):
    # Falcon-H1's mixer has a gated RMSNorm only with mamba_rms_norm, over mamba_d_ssm channels,
    # the gate after the norm (mamba_norm_before_gate): rms_norm_gated with the weight (flags 1),
    # as kiln's patch calls it.
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "FalconH1Config"):
        pytest.skip("transformers has no Falcon-H1")
    config = transformers.FalconH1Config(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=64, mamba_d_ssm=384, mamba_n_heads=6,
                                         mamba_d_head=64, mamba_n_groups=1, mamba_rms_norm=True)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    assert kiln.compile("rms_norm_gated", "bf16", 384, arch="sm_90", format="cubin", flags=1)["from_cache"]
    # Without the norm in its mixer, nothing of the kind is prewarmed.
    config.mamba_rms_norm = False
    config.to_json_file(str(path))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    assert not kiln.compile("rms_norm_gated", "bf16", 512, arch="sm_90", format="cubin", flags=512 | 1)["from_cache"]


def test_falcon_h1s_patched_gated_norm_calls_kiln_as_prewarmed(monkeypatch):
    # The module the prewarm above serves: Falcon-H1's one-group gated norm, the gate after the
    # norm, taken by kiln's patch as rms_norm_gated(x, z, weight, eps, "silu", True).
    import torch
    modeling = pytest.importorskip("transformers.models.falcon_h1.modeling_falcon_h1")
    norm = modeling.FalconH1RMSNormGated(384, eps=1e-6, n_groups=1, norm_before_gate=True)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    model = torch.nn.ModuleDict({"norm": norm})
    x, z = torch.randn(2, 3, 384), torch.randn(2, 3, 384)
    with torch.no_grad():
        expected = norm(x, z)
    assert [r.kind for r in kiln.patch(model).replaced] == ["rms_norm_gated (silu of the gate, after the norm)"]
    calls = []
    real = kiln.norm_ops.rms_norm_gated
    monkeypatch.setattr(kiln.norm_ops, "rms_norm_gated", lambda *a: calls.append(a[-2:]) or real(*a))
    with torch.no_grad():
        torch.testing.assert_close(model["norm"](x, z), expected)
    assert calls == [("silu", True)]


def test_kimi_linear_prewarms_its_gated_norm_latent_norms_and_shared_expert(fresh_cache, tmp_path):
    # Kimi Linear, as kiln's patch takes it: each delta-attention head closed by a sigmoid-gated
    # RMSNorm (weight 1 | sigmoid 256) at linear_head_dim, the MLA's compressed kv normalised at
    # kv_lora_rank, the shared expert a SwiGLU of moe_intermediate_size x num_shared_experts.
    kimi = {"model_type": "kimi_linear", "hidden_size": 2304, "intermediate_size": 9216,
            "moe_intermediate_size": 1024, "num_shared_experts": 1, "num_attention_heads": 32,
            "num_key_value_heads": 32, "head_dim": 64, "kv_lora_rank": 512, "q_lora_rank": None,
            "linear_head_dim": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(kimi))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    assert kiln.compile("rms_norm_gated", "bf16", 128, arch="sm_90", format="cubin", flags=1 | 256)["from_cache"]
    assert kiln.compile("rms_norm", "bf16", 512, arch="sm_90", format="cubin")["from_cache"]
    assert kiln.compile("swiglu", "bf16", 1024, arch="sm_90", format="cubin", flags=1)["from_cache"]


@pytest.mark.parametrize("name", ["kimi_linear", "deepseek_v3", "glm4_moe_lite"])
def test_prewarm_covers_the_norms_and_experts_kiln_patch_takes_in_mla_models(fresh_cache, tmp_path, name):
    # A tiny model of each, patched: every RMSNorm, gated norm, MLP and RoPE kiln.patch replaces is
    # at a width its config's prewarm compiled (norms with their weight: flags 1; the gated norm
    # with the sigmoid of its gate: 1 | 256; an MLP's SwiGLU of two tensors: flags 1; the latent
    # attention's RoPE: adjacent pairs of the 8 rotated columns written de-interleaved
    # (rope_interleave) from half the table, 512 | 128, q's 4 heads and one k head).
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=100, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
                  qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    if name == "kimi_linear":
        if not hasattr(transformers, "KimiLinearConfig"):
            pytest.skip("transformers has no Kimi Linear")
        config = transformers.KimiLinearConfig(
            **common, num_experts=4, num_experts_per_token=2, num_shared_experts=2, linear_head_dim=24,
            linear_num_heads=4, head_dim=16, layer_types=["linear_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse"])
        model = transformers.KimiLinearForCausalLM(config)
    else:
        prefix = {"deepseek_v3": "DeepseekV3", "glm4_moe_lite": "Glm4MoeLite"}[name]
        if not hasattr(transformers, f"{prefix}Config"):
            pytest.skip(f"transformers has no {prefix}")
        config = getattr(transformers, f"{prefix}Config")(
            **common, q_lora_rank=24, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2,
            first_k_dense_replace=1, n_group=1, topk_group=1)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    taken = []
    for replaced in kiln.patch(model).replaced:
        module = model.get_submodule(replaced.path)
        if replaced.op == "rope":
            assert "de-interleaved" in replaced.kind
            taken.append(("rope", config.qk_rope_head_dim, 512 | 128))
        elif replaced.kind.startswith("moe experts"):
            # The routed experts' packed gate_up (flags 0: rows of 2 x the width).
            taken.append(("swiglu", module.intermediate_dim, 0))
        elif replaced.kind.startswith("rms_norm_gated"):
            assert "sigmoid" in replaced.kind
            taken.append(("rms_norm_gated", module.weight.shape[0], 1 | 256))
        elif replaced.kind.startswith("rms_norm"):
            taken.append(("rms_norm", module.weight.shape[0], 1))
        elif replaced.kind == "mlp swiglu":
            taken.append(("swiglu", module.gate_proj.out_features, 1))
    widths = {(op, width) for op, width, _ in taken}
    # The MLA's compressed kv (and DeepSeek's q), two shared experts, the gated norm where there is one.
    assert ("rms_norm", 16) in widths and ("swiglu", 64) in widths
    assert (("rms_norm_gated", 24) in widths) == (name == "kimi_linear")
    # Kimi Linear's latent attention has no RoPE; every model's routed experts are gated by kiln.
    assert (("rope", 8) in widths) == (name != "kimi_linear")
    assert ("swiglu", 32) in widths
    for op, width, flags in taken:
        assert kiln.compile(op, "bf16", width, arch="sm_90", format="cubin", flags=flags)["from_cache"], (op, width)


def test_prewarm_covers_the_experts_kiln_patch_takes_in_a_moe_model(fresh_cache, tmp_path):
    # Qwen3-MoE: experts of moe_intermediate_size, gated by kiln on every routed token's packed
    # gate_up (flags 0), besides the dense width of its config (intermediate_size).
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                         moe_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    model = transformers.AutoModelForCausalLM.from_config(config, experts_implementation="grouped_mm")
    experts = [r for r in kiln.patch(model).replaced if r.kind.startswith("moe experts")]
    assert len(experts) == 2
    assert kiln.compile("swiglu", "bf16", 48, arch="sm_90", format="cubin", flags=0)["from_cache"]


def test_glm5_next_prewarms_what_its_patched_language_model_calls(fresh_cache, tmp_path):
    # GLM-5 Next's config (a multimodal one: its language model in text_config) writes head_dim
    # 0, which the prewarm read as a bad size. Its language model, as kiln's patch takes it: the
    # delta attention's sigmoid-gated head norm (flags 1 | 256) at linear_head_dim, the
    # hyper-connections' unweighted norm of hc_mult streams (flags 0), the MLA's latent norms and
    # the sparse attention indexer's key LayerNorm (weight and bias: flags 3).
    configuration = pytest.importorskip("transformers.models.glm5_next.configuration_glm5_next")
    config = configuration.Glm5NextConfig()
    text = config.text_config
    assert text.head_dim == 0
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0

    def prewarmed(op, hidden, flags):
        return kiln.compile(op, "bf16", hidden, arch="sm_90", format="cubin", flags=flags)["from_cache"]

    assert prewarmed("rms_norm_gated", text.linear_head_dim, 1 | 256)
    assert prewarmed("rms_norm", text.hc_mult * text.hidden_size, 0)
    assert prewarmed("rms_norm", text.kv_lora_rank, 1) and prewarmed("rms_norm", text.q_lora_rank, 1)
    assert prewarmed("layer_norm", text.index_head_dim, 3)


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "gemma3", "minimax_m3_vl"])
def test_a_multimodal_models_vision_tower_is_prewarmed_as_its_patch_calls_kiln(fresh_cache, tmp_path, name):
    # A tiny Qwen2-VL (its QuickGELU MLPs left), Qwen2.5-VL, Qwen3-VL, GLM-4V, Gemma 3 (SigLIP, no
    # RoPE) and MiniMax-M3-VL, their towers patched: each norm, MLP and attention RoPE kiln.patch
    # replaces there is a problem the config's prewarm compiled (norms with their weight: 1,
    # LayerNorms' bias too: 2; SwiGLU of two tensors and the GELU (tanh) of a flat row: 1, erf: 1 | 2;
    # RoPE over the tower's 4 + 4 heads of 16 (16 | 32) from its fp32 table (2), MiniMax-M3-VL's
    # first 12 columns from a table of the tower's dtype), beside the language model's RoPE at its
    # own head dim.
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    from transformers.models.qwen3_vl import modeling_qwen3_vl
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256)
    vision = dict(depth=2, hidden_size=64, intermediate_size=96, num_heads=4, out_hidden_size=64,
                  spatial_merge_size=2, temporal_patch_size=2)
    if name == "qwen2_vl":
        from transformers.models.qwen2_vl import modeling_qwen2_vl
        config = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(
            depth=2, embed_dim=64, hidden_size=64, mlp_ratio=2, num_heads=4, patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2))
        tower = modeling_qwen2_vl.Qwen2VisionTransformerPretrainedModel(config.vision_config)
    elif name == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=dict(
            vision, patch_size=14, window_size=56, fullatt_block_indexes=[1]))
        tower = modeling_qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel(config.vision_config)
    elif name == "qwen3_vl":
        config = transformers.Qwen3VLConfig(text_config=dict(text, head_dim=16), vision_config=dict(
            vision, patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[1]))
        tower = modeling_qwen3_vl.Qwen3VLVisionModel(config.vision_config)
    elif name == "glm4v":
        from transformers.models.glm4v import modeling_glm4v
        config = transformers.Glm4vConfig(text_config=text, vision_config=dict(vision, patch_size=14))
        tower = modeling_glm4v.Glm4vVisionModel(config.vision_config)
    elif name == "minimax_m3_vl":
        configuration = pytest.importorskip("transformers.models.minimax_m3_vl.configuration_minimax_m3_vl")
        modeling = pytest.importorskip("transformers.models.minimax_m3_vl.modeling_minimax_m3_vl")
        config = configuration.MiniMaxM3VLConfig(text_config=dict(text, head_dim=16), vision_config=dict(
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4))
        tower = modeling.MiniMaxM3VLVisionModel(config.vision_config)
    else:
        config = transformers.Gemma3Config(text_config=dict(text, head_dim=16), vision_config=dict(
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, image_size=56,
            patch_size=14, vision_use_head=True))
        tower = transformers.SiglipVisionModel(config.vision_config)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0
    taken = set()
    for replaced in kiln.patch(tower).replaced:
        module = tower.get_submodule(replaced.path)
        if replaced.op == "rope":
            # MiniMax-M3-VL's [S, 12] bf16 table rows (24 bytes) make its calls 8-byte aligned.
            taken.add(("rope", 16, 16 | 32, 12, 8) if name == "minimax_m3_vl" else ("rope", 16, 2 | 16 | 32))
        elif replaced.op == "rms_norm":
            taken.add(("rms_norm", module.weight.shape[0], 1))
        elif replaced.op == "layer_norm":
            taken.add(("layer_norm", module.weight.shape[0], 1 | 2))
        elif replaced.op == "swiglu":
            taken.add(("swiglu", module.gate_proj.out_features, 1))
        elif replaced.op == "gelu":
            first = module.linear_fc1 if hasattr(module, "linear_fc1") else module.fc1
            taken.add(("gelu", first.out_features, 1 | 2 if config.vision_config.hidden_act == "gelu" else 1))
    ops = {"qwen2_vl": {"rope", "layer_norm"}, "qwen2_5_vl": {"rope", "rms_norm", "swiglu"}, "qwen3_vl": {"rope", "layer_norm", "gelu"},
           "glm4v": {"rope", "rms_norm", "layer_norm", "swiglu"},  # GLM-4V's merger: a LayerNorm
           "gemma3": {"layer_norm", "gelu"}, "minimax_m3_vl": {"rope", "layer_norm", "gelu"}}[name]
    assert {op for op, *_ in taken} == ops
    for op, width, flags, *rest in taken:
        aux, align = rest if rest else (0, 16)
        assert kiln.compile(op, "bf16", width, arch="sm_90", format="cubin", flags=flags, aux=aux,
                            align=align)["from_cache"], (op, width)
    # The language model's RoPE (16-wide heads too here, from a bf16 table: flags 16) stays prewarmed.
    assert kiln.compile("rope", "bf16", 16, arch="sm_90", format="cubin", flags=16)["from_cache"]


def test_inkling2_prewarms_every_call_its_patched_model_makes(fresh_cache, tmp_path):
    # Inkling 2's config has no intermediate_size (every MLP of its language model is its
    # experts, whose softcapped gate kiln's patch leaves), which the prewarm read as missing. A
    # tiny one, patched, runs its language model and its tower on the CPU; every kiln call they
    # make, as each op's dispatcher sees it, is a problem its config's prewarm compiled: the
    # decoder norms over its fp32 residual stream (with their bf16 weight, kept as fp32), the
    # block residuals' and value heads' unweighted fp32 norms, the embedding's bf16 norm; the
    # tower's LayerNorms, erf GELU (flat rows: 1 | 2) and RoPE of interleaved pairs from an fp32
    # table over its 2 + 2 heads (1 | 2 | 16).
    import torch
    modeling = pytest.importorskip("transformers.models.inkling2.modeling_inkling2")
    from vision_towers import inkling2_model_config, other_tower_inputs
    config = inkling2_model_config()
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    assert "intermediate_size" not in json.loads(path.read_text())["text_config"]
    assert kiln.prewarm(dtypes="bf16", archs="sm_90", config=str(path))["failed"] == 0

    config.text_config._attn_implementation = "eager"  # its attention has no sdpa path
    language = modeling.Inkling2ForCausalLM(config.text_config).to(torch.bfloat16)
    for module in language.modules():
        if isinstance(module, modeling.Inkling2TopKRouter):
            module.float()  # routing runs in fp32, as the checkpoint keeps it
    config.vision_config._attn_implementation = "sdpa"
    tower = modeling.Inkling2VisionModel(config.vision_config).to(torch.bfloat16)
    kiln.patch(language)
    kiln.patch(tower)

    with torch.no_grad(), KilnCalls() as calls:
        language(input_ids=torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(0)))
        tower(**other_tower_inputs(tower))
    dtypes = {torch.bfloat16: "bf16", torch.float32: "fp32"}
    taken = set()
    for op, args in calls:
        x = args[0]
        if op == "rms_norm":
            taken.add((op, dtypes[x.dtype], x.shape[-1], 1 if args[1] is not None else 0))
        elif op == "layer_norm":
            taken.add((op, dtypes[x.dtype], x.shape[-1], 1 | 2))
        elif op == "gelu":
            assert args[2] == "none"
            taken.add((op, dtypes[x.dtype], x.shape[-1], 1 | 2))
        else:
            assert op == "rope" and args[4] is True and args[2].dtype == torch.float32
            taken.add((op, dtypes[x.dtype], x.shape[-1], 1 | 2 | 16))
    assert taken == {("rms_norm", "bf16", 64, 1), ("rms_norm", "fp32", 64, 1), ("rms_norm", "fp32", 64, 0),
                     ("rms_norm", "fp32", 16, 0), ("rms_norm", "fp32", 24, 0), ("layer_norm", "bf16", 64, 3),
                     ("gelu", "bf16", 256, 3), ("rope", "bf16", 32, 19)}
    for op, dtype, width, flags in taken:
        assert kiln.compile(op, dtype, width, arch="sm_90", format="cubin", flags=flags)["from_cache"], \
            (op, dtype, width, flags)


@pytest.mark.parametrize("rotary", [False, True])
def test_cogvideox_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path, rotary):
    # A tiny CogVideoX (diffusers; with `rotary`, CogVideoX-5b's form), patched and run on the CPU:
    # every kiln call it makes, as each op's dispatcher sees it, is a problem its config's prewarm
    # compiled: each stream's AdaLN and block seam over an affine LayerNorm (its weight in the
    # kernel: 1 | 4), the gated residual in place per sample (8 | 16), the q/k LayerNorms of each
    # head and the final one (1 | 2), the feed-forward's tanh GELU of a flat row (1); 5b's rotation
    # of the video tokens' q and k [B, H, S, D] in place from fp32 tables, interleaved, 2 + 2 heads
    # (1 | 2 | 16; positions inner, 8, where the norms leave each head's positions together).
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "CogVideoXTransformer3DModel",
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=32,
        text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
        max_text_seq_length=8, use_rotary_positional_embeddings=rotary)

    g = torch.Generator().manual_seed(1)
    angles = torch.randn(32, 8, generator=g)
    tables = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)) if rotary else None
    with torch.no_grad(), KilnCalls() as calls:
        model(hidden_states=torch.randn(2, 2, 4, 8, 8, generator=g).to(torch.bfloat16),
              encoder_hidden_states=torch.randn(2, 8, 32, generator=g).to(torch.bfloat16),
              timestep=torch.tensor([10, 500]), image_rotary_emb=tables)
    taken = set()
    for op, args in calls:
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        else:
            assert op == "rope_"
            q, k, cos = args[0], args[1], args[2]
            assert q.shape[1] == k.shape[1] == 2 and cos.dtype == torch.float32 and cos.shape == (32, 16)
            taken.add(("rope", q.shape[-1], 1 | 2 | 16 | (8 if q.stride(2) == q.shape[-1] else 0)))
    expected = {("adaln", 32, 5), ("gated_adaln", 32, 5), ("gated_residual", 32, 24), ("layer_norm", 32, 3),
                ("layer_norm", 16, 3), ("gelu", 128, 1)}
    assert taken - expected == ({("rope", 16, 27)} if rotary else set()) and expected <= taken
    assert_prewarmed(taken)


@pytest.mark.parametrize("edit", [False, True])
def test_qwen_image_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path, edit):
    # A tiny Qwen-Image (diffusers; with `edit`, Qwen-Image-Edit-2511's per-token modulation),
    # patched and run on the CPU: every kiln call it makes, as each op's dispatcher sees it, is a
    # problem its config's prewarm compiled: each stream's AdaLN and block seam over a LayerNorm
    # with no affine (4; per token, 32, for the edit's image tokens), the gated residual in place
    # (16; per sample, 8), the text input's RMSNorm with its weight (1), the feed-forward's tanh
    # GELU of a flat row (1), and each stream's per-head q/k norms and rotation in place from the
    # complex frequencies' fp32 half tables, interleaved, 4 + 4 heads (1 | 2 | 128 | 48 | 256).
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "QwenImageTransformer2DModel",
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, axes_dims_rope=(4, 6, 6), zero_cond_t=edit)

    g = torch.Generator().manual_seed(1)
    images = 2 if edit else 1
    with torch.no_grad(), KilnCalls() as calls:
        model(hidden_states=torch.randn(2, 24 * images, 16, generator=g).to(torch.bfloat16),
              encoder_hidden_states=torch.randn(2, 7, 32, generator=g).to(torch.bfloat16),
              encoder_hidden_states_mask=torch.ones(2, 7, dtype=torch.long),
              timestep=torch.tensor([0.3, 0.8]).to(torch.bfloat16), img_shapes=[[(1, 4, 6)] * images] * 2)
    taken = set()
    for op, args in calls:
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        else:
            assert op == "head_norm_rope_"
            q, k, cos = args[0], args[1], args[4]
            assert q.shape[2] == k.shape[2] == 4 and cos.dtype == torch.float32 and cos.shape[-1] == 8
            taken.add(("rope", q.shape[-1], 1 | 2 | 128 | 48 | 256))
    expected = {("adaln", 64, 4), ("gated_adaln", 64, 4), ("gated_residual", 64, 24), ("rms_norm", 32, 1),
                ("gelu", 256, 1), ("rope", 16, 435)}
    if edit:  # the image stream's modulations are per token, the text's per sample
        expected |= {("adaln", 64, 36), ("gated_adaln", 64, 36), ("gated_residual", 64, 16)}
    assert taken == expected
    assert_prewarmed(taken)


def test_flux2_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path):
    # A tiny FLUX.2 (diffusers), patched and run on the CPU: every kiln call it makes, as each op's
    # dispatcher sees it, is a problem its config's prewarm compiled: the blocks' AdaLN and seams
    # over a LayerNorm with no affine (4), the gated residuals per sample (8; in place, 16), the
    # feed-forwards' SwiGLU of the packed projection (flat, 1; the single blocks' into a slice of
    # to_out's input, rows apart, 0), each attention's per-head q/k norms and rotation from the
    # fp32 table, interleaved, 2 + 2 heads (1 | 2 | 16 | 256; 32 where the counts are fours).
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "Flux2Transformer2DModel",
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=24, axes_dims_rope=(4, 4, 4, 4), timestep_guidance_channels=16)

    g = torch.Generator().manual_seed(1)
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(3.0), torch.arange(4.0), torch.zeros(1),
                                     indexing="ij"), -1).reshape(12, 4)
    with torch.no_grad(), KilnCalls() as calls:
        model(hidden_states=torch.randn(1, 12, 8, generator=g).to(torch.bfloat16),
              encoder_hidden_states=torch.randn(1, 5, 24, generator=g).to(torch.bfloat16),
              timestep=torch.tensor([0.5]).to(torch.bfloat16), guidance=torch.tensor([4.0]), img_ids=ids,
              txt_ids=torch.zeros(5, 4))
    taken = set()
    for op, args in calls:
        x = args[0]
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        elif op == "swiglu":
            assert len(args) == 1 or args[1] is None  # the packed projection
            # The feed-forwards' is the projection's whole output; the single blocks' a slice of it.
            taken.add((op, x.shape[-1] // 2, 1 if x.is_contiguous() else 0))
        else:
            assert op in ("head_norm_rope", "head_norm_rope_")
            q, k, cos = args[0], args[1], args[4]
            assert q.shape[2] == k.shape[2] == 4 and cos.dtype == torch.float32 and cos.shape[-1] == 16
            taken.add(("rope", q.shape[-1], 1 | 2 | 16 | 32 | 256))
    assert taken == {("adaln", 64, 4), ("gated_adaln", 64, 4), ("gated_residual", 64, 8),
                     ("gated_residual", 64, 24), ("swiglu", 192, 1), ("swiglu", 192, 0), ("rope", 16, 307)}
    assert_prewarmed(taken)


def test_flux3_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path):
    # A tiny FLUX.3 (diffusers), its q/k norms in fp32 as the loader keeps them, patched and run
    # on the CPU with a reference image: every kiln call it makes is a problem its config's
    # prewarm compiled. Without autograd: the blocks' and the output's AdaLN over a LayerNorm with
    # no affine, one row a sample (4; per token, 36, the joint blocks' image and reference stream),
    # the gated residuals (per sample, 8; per token, 0), the feed-forwards' SwiGLU of the packed
    # projection (flat, 1), each attention's per-head q/k norms and rotation
    # from the fp32 table, interleaved, 4 + 4 heads (1 | 2 | 16 | 32 | 256), in bf16. Recording a
    # graph: the blocks' and the output's LayerNorms as modules (0), diffusers' norms of the fp32
    # heads (kiln's rms_norm with the fp32 weight, 1) and kiln.rope of them (1 | 2 | 16 | 32), in
    # fp32.
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "Flux3Transformer2DModel", in_channels=8, cond_in_channels=8, num_layers=1, num_single_layers=2,
        attention_head_dim=16, num_attention_heads=4, joint_attention_dim=24, timestep_channels=16,
        axes_dims_rope=(4, 4, 4, 4))
    for name, p in model.named_parameters():
        if any(k in name.split(".") for k in model._keep_in_fp32_modules):
            p.data = p.data.float()
    g = torch.Generator().manual_seed(1)
    ids = torch.zeros(12, 4)
    ids[:, 1:3] = torch.stack(torch.meshgrid(torch.arange(3.0), torch.arange(4.0), indexing="ij"), -1).reshape(12, 2)
    inputs = dict(hidden_states=torch.randn(1, 12, 8, generator=g).to(torch.bfloat16),
                  encoder_hidden_states=torch.randn(1, 5, 24, generator=g).to(torch.bfloat16),
                  timestep=torch.tensor([0.5]).to(torch.bfloat16), img_ids=ids, txt_ids=torch.zeros(5, 4),
                  image_cond_hidden_states=torch.randn(1, 12, 8, generator=g).to(torch.bfloat16),
                  image_cond_ids=ids + torch.tensor([1.0, 0, 0, 0]))

    def taken_by(calls):
        taken = set()
        for op, args in calls:
            x = args[0]
            if (problem := dit_problem(op, args)) is not None:
                taken.add((x.dtype, *problem))
            elif op == "swiglu":
                assert len(args) == 1 or args[1] is None  # the packed projection
                taken.add((x.dtype, op, x.shape[-1] // 2, 1 if x.is_contiguous() else 0))
            else:
                assert op in ("head_norm_rope", "rope")
                q, k, cos = args[0], args[1], args[2 if op == "rope" else 4]
                assert q.shape[2] == k.shape[2] == 4 and cos.dtype == torch.float32 and cos.shape[-1] == 16
                taken.add((q.dtype, "rope", q.shape[-1], 1 | 2 | 16 | 32 | (256 if op == "head_norm_rope" else 0)))
        return taken

    with torch.no_grad(), KilnCalls() as calls:
        model(**inputs)
    inference = taken_by(calls)
    assert inference == {(torch.bfloat16, "adaln", 64, 4), (torch.bfloat16, "adaln", 64, 36),
                         (torch.bfloat16, "gated_residual", 64, 8), (torch.bfloat16, "gated_residual", 64, 0),
                         (torch.bfloat16, "swiglu", 192, 1), (torch.bfloat16, "rope", 16, 307)}
    with KilnCalls() as calls:
        model(**inputs)
    recording = taken_by(calls) - inference
    assert recording == {(torch.bfloat16, "layer_norm", 64, 0), (torch.float32, "rms_norm", 16, 1),
                         (torch.float32, "rope", 16, 51)}
    for dtype, op, width, flags in inference | recording:
        name = "bf16" if dtype == torch.bfloat16 else "fp32"
        assert kiln.compile(op, name, width, arch="sm_90", format="cubin", flags=flags)["from_cache"], \
            (op, name, width, flags)


@pytest.mark.parametrize("rope", ["split", "interleaved"])
def test_ltx2_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path, rope):
    # A tiny LTX-2 (diffusers), patched and run on the CPU with a timestep per video token (its
    # conditioned frames' form): every kiln call it makes, as each op's dispatcher sees it, is a
    # problem its config's prewarm compiled. Each stream's AdaLN and seams over an RMSNorm with no
    # weight, the table rows beside temb (16; per token, 32, in the video stream), the gated
    # residual in place (16; per sample, 8, in the audio stream), the q/k norms across heads (1),
    # the feed-forwards' tanh GELU (1), the output LayerNorms (0); split: each token's heads as
    # rows of one head with an fp32 half table (2 | 128), q and k together (one head each, 64) or
    # alone; interleaved: the self-attentions' norms and rotation fused (rms_norm_rope 2), the
    # audio-video attentions' q and k rotated alone by full-row tables (1 | 2).
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "LTX2VideoTransformer3DModel",
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
        audio_cross_attention_dim=8, num_layers=2, caption_channels=16, rope_type=rope)

    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    with torch.no_grad(), KilnCalls() as calls:
        model(hidden_states=torch.randn(2, 24, 4, generator=g).to(bf16),
              audio_hidden_states=torch.randn(2, 5, 4, generator=g).to(bf16),
              encoder_hidden_states=torch.randn(2, 7, 16, generator=g).to(bf16),
              audio_encoder_hidden_states=torch.randn(2, 7, 16, generator=g).to(bf16),
              timestep=(1000 * torch.rand(2, 24, generator=g)).to(bf16), audio_timestep=torch.tensor([300.0, 700.0]),
              num_frames=2, height=3, width=4, audio_num_frames=5)
    taken = set()
    for op, args in calls:
        x = args[0]
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        elif op == "rope":
            q, k, cos = args[0], args[1], args[2]
            assert cos.dtype == torch.float32 and q.dim() == 3 and k.shape[:2] == q.shape[:2]
            heads = (64 if k.shape[-1] else 0)
            if rope == "split":
                taken.add(("rope", q.shape[-1], 2 | 128 | heads))
            else:
                assert k.shape[-1] == 0
                taken.add(("rope", q.shape[-1], 1 | 2))
        else:
            assert op == "rms_norm_rope"
            assert rope == "interleaved" and args[5].dtype == torch.float32
            taken.add((op, x.shape[-1], 2))
    expected = {("adaln", 16, 48), ("gated_adaln", 16, 48), ("adaln", 8, 16), ("gated_adaln", 8, 16),
                ("gated_residual", 16, 16), ("gated_residual", 8, 24), ("rms_norm", 16, 1), ("rms_norm", 8, 1),
                ("layer_norm", 16, 0), ("layer_norm", 8, 0), ("gelu", 64, 1), ("gelu", 32, 1)}
    if rope == "split":
        expected |= {("rope", 8, 194), ("rope", 4, 194), ("rope", 4, 130)}
    else:
        expected |= {("rms_norm_rope", 16, 2), ("rms_norm_rope", 8, 2), ("rope", 8, 3)}
    assert taken == expected
    assert_prewarmed(taken)


def test_z_image_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path):
    # A tiny Z-Image (diffusers), patched and run on the CPU with captions of two lengths: every
    # kiln call it makes, as each op's dispatcher sees it, is a problem its config's prewarm
    # compiled. The modulated blocks' AdaLN and seam over an RMSNorm with its weight (1), per
    # sample, the gated residual in place (16 | 8), the sublayers' and the caption embedder's
    # RMSNorms with their weights (1), the final LayerNorm with no affine (0), each feed-forward's
    # SwiGLU of two projections (flat, 1) and each attention's per-head q/k norms and rotation from
    # the complex frequencies' fp32 half tables, interleaved, 2 + 2 heads (1 | 2 | 16 | 128 | 256).
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "ZImageTransformer2DModel",
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2,
        n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6], axes_lens=[64, 16, 16])

    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    with torch.no_grad(), KilnCalls() as calls:
        model(x=[torch.randn(4, 1, 8, 8, generator=g).to(bf16) for _ in range(2)], t=torch.tensor([0.3, 0.7]).to(bf16),
              cap_feats=[torch.randn(n, 16, generator=g).to(bf16) for n in (7, 5)])
    taken = set()
    for op, args in calls:
        x = args[0]
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        elif op == "swiglu":
            assert args[1] is not None and x.is_contiguous()
            taken.add((op, x.shape[-1], 1))
        else:
            assert op == "head_norm_rope"
            q, k, cos = args[0], args[1], args[4]
            assert q.shape[2] == k.shape[2] == 2 and cos.dtype == torch.float32 and cos.shape[-1] == 8
            taken.add(("rope", q.shape[-1], 1 | 2 | 16 | 128 | 256))
    assert taken == {("adaln", 32, 1), ("gated_adaln", 32, 1), ("gated_residual", 32, 24), ("rms_norm", 32, 1),
                     ("rms_norm", 16, 1), ("layer_norm", 32, 0), ("swiglu", 85, 1), ("rope", 16, 403)}
    assert_prewarmed(taken)


class KilnCallsAndOuts(KilnCalls):
    """KilnCalls with each call into a given output (an ``.out`` overload) named "<op> out"."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "kiln" and kwargs and "out" in kwargs:
            self.calls.add((func.__name__.split(".")[0] + " out", args))
            return func(*args, **kwargs)
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize("cls", ["HunyuanVideoTransformer3DModel", "HunyuanVideo15Transformer3DModel",
                                 "HunyuanImageTransformer2DModel"])
def test_hunyuan_video_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path, cls):
    # A tiny HunyuanVideo (diffusers; or HunyuanVideo 1.5, double blocks only; or HunyuanImage 2.1,
    # HunyuanVideo's blocks over an image), patched and run on the CPU with a padded prompt: every kiln call it makes, as each op's dispatcher sees it, is a
    # problem its config's prewarm compiled. Each stream's AdaLN and block seam over a LayerNorm with
    # no affine (4), the gated residual in place and not (16; per sample, 8), the text tokens' q/k
    # RMSNorms with their weights (1), the token refiner's and the projections' affine LayerNorms
    # (1 | 2), the feed-forwards' tanh GELU of a flat row (1) and the single blocks' into proj_out's
    # input (0), the video tokens' per-head q/k norms and rotation in place from diffusers' fp32
    # table, interleaved, 2 + 2 heads (1 | 2 | 16 | 256).
    import torch
    v15, image = cls == "HunyuanVideo15Transformer3DModel", cls == "HunyuanImageTransformer2DModel"
    sizes = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
                 num_refiner_layers=1, text_embed_dim=16, rope_axes_dim=(8, 8) if image else (4, 6, 6))
    more = dict(text_embed_2_dim=12, image_embed_dim=24) if v15 else dict(
        num_single_layers=2, text_embed_2_dim=12) if image else dict(
        num_single_layers=2, patch_size=1, patch_size_t=1, pooled_projection_dim=8)
    model = _prewarmed_and_patched(tmp_path, cls, **sizes, **more)

    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    inputs = dict(hidden_states=torch.randn(2, 4, *((4, 6) if image else (3, 4, 4)), generator=g).to(bf16),
                  encoder_hidden_states=torch.randn(2, 7, 16, generator=g).to(bf16),
                  encoder_attention_mask=torch.tensor([[1] * 7, [1] * 4 + [0] * 3]))
    if image:
        inputs.update(timestep=torch.tensor([300.0, 700.0]).to(bf16),
                      encoder_hidden_states_2=torch.randn(2, 5, 12, generator=g).to(bf16),
                      encoder_attention_mask_2=torch.tensor([[1] * 5, [1] * 2 + [0] * 3]))
    elif v15:
        inputs.update(timestep=torch.tensor([300.0, 700.0]).to(bf16),
                      encoder_hidden_states_2=torch.randn(2, 5, 12, generator=g).to(bf16),
                      encoder_attention_mask_2=torch.tensor([[1] * 5, [1] * 2 + [0] * 3]),
                      image_embeds=torch.randn(2, 3, 24, generator=g).to(bf16))
    else:
        inputs.update(timestep=torch.tensor([300, 700]), pooled_projections=torch.randn(2, 8, generator=g).to(bf16),
                      guidance=torch.tensor([3000.0, 3000.0]).to(bf16))
    with torch.no_grad(), KilnCallsAndOuts() as calls:
        model(**inputs)
    taken = set()
    for op, args in calls:
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        else:
            assert op == "head_norm_rope_"
            q, k, cos = args[0], args[1], args[4]
            assert q.shape[2] == k.shape[2] == 2 and cos.dtype == torch.float32 and cos.shape[-1] == 16
            taken.add(("rope", q.shape[-1], 1 | 2 | 16 | 256))
    expected = {("adaln", 32, 4), ("gated_adaln", 32, 4), ("gated_residual", 32, 24), ("rms_norm", 16, 1),
                ("layer_norm", 32, 3), ("gelu", 128, 1), ("rope", 16, 275)}
    if v15:
        expected |= {("layer_norm", 12, 3), ("layer_norm", 24, 3)}
    else:
        expected |= {("gated_residual", 32, 8), ("gelu", 128, 0)} | ({("layer_norm", 12, 3)} if image else set())
    assert taken == expected
    assert_prewarmed(taken)


def test_chroma_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path):
    # A tiny Chroma (diffusers), patched and run on the CPU with a padded prompt: every kiln call it
    # makes, as each op's dispatcher sees it, is a problem its config's prewarm compiled. The pruned
    # AdaLN modules and the double blocks' seams over a LayerNorm with no affine (4), per sample from
    # the approximator's rows, the gated residual in place and not (16; 8), the approximator's
    # RMSNorm with its weight (1), the feed-forwards' tanh GELU of a flat row (1) and the single
    # blocks' into proj_out's input (0), the per-head q/k norms and rotation from diffusers' fp32
    # table, interleaved, 2 + 2 heads (1 | 2 | 16 | 256), in place on the joint attentions' streams.
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "ChromaTransformer2DModel", patch_size=1, in_channels=8, num_layers=2, num_single_layers=2,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=(4, 6, 6),
        approximator_num_channels=8, approximator_hidden_dim=48, approximator_layers=1)
    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(3.0), torch.arange(4.0), indexing="ij"), -1)
    mask = torch.ones(2, 17, dtype=torch.bool)
    mask[1, 3:5] = False
    with torch.no_grad(), KilnCallsAndOuts() as calls:
        model(hidden_states=torch.randn(2, 12, 8, generator=g).to(bf16),
              encoder_hidden_states=torch.randn(2, 5, 24, generator=g).to(bf16),
              timestep=torch.tensor([0.3, 0.7]).to(bf16), img_ids=ids.reshape(12, 3), txt_ids=torch.zeros(5, 3),
              attention_mask=mask)
    taken = set()
    for op, args in calls:
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        else:
            assert op in ("head_norm_rope", "head_norm_rope_")
            q, k, cos = args[0], args[1], args[4]
            assert q.shape[2] == k.shape[2] == 2 and cos.dtype == torch.float32 and cos.shape[-1] == 16
            taken.add(("rope", q.shape[-1], 1 | 2 | 16 | 256))
    assert taken == {("adaln", 32, 4), ("gated_adaln", 32, 4), ("gated_residual", 32, 24), ("gated_residual", 32, 8),
                     ("rms_norm", 48, 1), ("gelu", 128, 1), ("gelu", 128, 0), ("rope", 16, 275)}
    assert_prewarmed(taken)


@pytest.mark.parametrize("cls", ["OvisImageTransformer2DModel", "BriaFiboTransformer2DModel"])
def test_flux_copies_prewarm_every_call_their_patched_transformer_makes(fresh_cache, tmp_path, cls):
    # A tiny Ovis-Image or Bria FIBO (diffusers: FLUX's blocks under other names), patched and run
    # on the CPU: every kiln call it makes, as each op's dispatcher sees it, is a problem its
    # config's prewarm compiled. FLUX's AdaLN and double-block seams over a LayerNorm with no
    # affine (4), the gated residual in place and not (per sample: 24, 8), the per-head q/k norms
    # and rotation from diffusers' fp32 table, interleaved, 2 + 2 heads (1 | 2 | 16 | 256); Ovis-
    # Image's text input's RMSNorm with its weight (1) and its SwiGLUs, of the packed projection
    # (flat, 1) and into a slice of proj_out's input (0); Bria FIBO's tanh GELUs, flat (1) and
    # into the slice (0), its single blocks taking the joined stream.
    import torch
    ovis = cls == "OvisImageTransformer2DModel"
    own = dict(out_channels=8) if ovis else dict(text_encoder_dim=16)
    model = _prewarmed_and_patched(tmp_path, cls, patch_size=1, in_channels=8, num_layers=1, num_single_layers=2,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                   axes_dims_rope=(4, 6, 6), **own)
    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(3.0), torch.arange(4.0), indexing="ij"), -1)
    inputs = dict(hidden_states=torch.randn(2, 12, 8, generator=g).to(bf16),
                  encoder_hidden_states=torch.randn(2, 5, 24, generator=g).to(bf16),
                  timestep=torch.tensor([0.3, 0.7]).to(bf16), img_ids=ids.reshape(12, 3), txt_ids=torch.zeros(5, 3))
    if not ovis:
        inputs["text_encoder_layers"] = [torch.randn(2, 5, 16, generator=g).to(bf16) for _ in range(3)]
    with torch.no_grad(), KilnCallsAndOuts() as calls:
        model(**inputs)
    taken = set()
    for op, args in calls:
        x = args[0]
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        elif op in ("swiglu", "swiglu out"):
            assert (len(args) == 1 or args[1] is None) and x.is_contiguous()  # the packed projection
            taken.add(("swiglu", x.shape[-1] // 2, 1 if op == "swiglu" else 0))
        else:
            assert op in ("head_norm_rope", "head_norm_rope_")
            q, k, cos = args[0], args[1], args[4]
            assert q.shape[2] == k.shape[2] == 2 and cos.dtype == torch.float32 and cos.shape[-1] == 16
            taken.add(("rope", q.shape[-1], 1 | 2 | 16 | 256))
    own_calls = {("rms_norm", 24, 1), ("swiglu", 128, 1), ("swiglu", 128, 0)} if ovis else \
        {("gelu", 128, 1), ("gelu", 128, 0)}
    assert taken == {("adaln", 32, 4), ("gated_adaln", 32, 4), ("gated_residual", 32, 24), ("gated_residual", 32, 8),
                     ("rope", 16, 275)} | own_calls
    assert_prewarmed(taken)


@pytest.mark.parametrize("causal_condition", [True, False], ids=["per-token", "per-sample"])
def test_qwen_image21_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path, causal_condition):
    # A tiny Qwen-Image 2.1 (diffusers), patched and run on the CPU: every kiln call it makes, as
    # each op's dispatcher sees it, is a problem its config's prewarm compiled. The blocks' AdaLN
    # and seam over a LayerNorm with no affine (4), per token under causal_condition (32), the
    # gated residual in place (16; per sample, 8), the feed-forwards' SwiGLU of two tensors (flat,
    # 1), the attention's q/k norms and rotation by fp32 half tables, interleaved, 2 + 2 heads
    # (1 | 2 | 16 | 128 | 256), the text's RMSNorm with its weight (1), the output LayerNorm (0).
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "QwenImage21Transformer2DModel", patch_size=1, in_channels=8, out_channels=8, num_layers=2,
        attention_head_dim=16, num_attention_heads=2, context_in_dim=24, mlp_ratio=2, axes_dims_rope=(4, 6, 6),
        causal_condition=causal_condition)
    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    img_mask = torch.cat([torch.zeros(1, 7, dtype=torch.bool), torch.ones(1, 6, dtype=torch.bool)], 1)
    with torch.no_grad(), KilnCalls() as calls:
        model(hidden_states=torch.randn(1, 24, 8, generator=g).to(bf16),
              encoder_hidden_states=torch.randn(1, 7, 24, generator=g).to(bf16), timestep=torch.tensor([0.5]).to(bf16),
              img_shapes=[[(1, 4, 6)]], img_mask=img_mask)
    taken = set()
    for op, args in calls:
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        elif op == "swiglu":
            assert args[1] is not None and args[0].is_contiguous()
            taken.add((op, args[0].shape[-1], 1))
        else:
            assert op == "head_norm_rope"
            q, k, cos = args[0], args[1], args[4]
            assert q.shape[2] == k.shape[2] == 2 and cos.dtype == torch.float32 and 2 * cos.shape[-1] == q.shape[-1]
            taken.add(("rope", q.shape[-1], 1 | 2 | 16 | 128 | 256))
    modulation = 4 | (32 if causal_condition else 0)
    assert taken == {("adaln", 32, modulation), ("gated_adaln", 32, modulation),
                     ("gated_residual", 32, 16 | (0 if causal_condition else 8)), ("swiglu", 64, 1),
                     ("rope", 16, 403), ("rms_norm", 24, 1), ("layer_norm", 32, 0)}
    assert_prewarmed(taken)


def test_mochi_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path):
    # A tiny Mochi (diffusers), patched and run on the CPU with a padded prompt: every kiln call it
    # makes, as each op's dispatcher sees it, is a problem its config's prewarm compiled. Each
    # stream's AdaLN over an RMSNorm with no weight (0), the gated norms of the sublayers' outputs
    # and the residual add with the next norm, fp32 table rows (16 | 128), the output AdaLN over a
    # LayerNorm (4), the per-head q/k RMSNorms with their weights (1), the feed-forwards' SwiGLU of
    # the packed projection (a flat row, 1), and the rotation of each token's heads as one
    # row by an fp32 half table, interleaved, one head of q and one of k (1 | 2 | 64 | 128).
    import torch
    model = _prewarmed_and_patched(tmp_path, "MochiTransformer3DModel", patch_size=2, num_attention_heads=2,
                                   attention_head_dim=16, num_layers=2, pooled_projection_dim=24, in_channels=4,
                                   text_embed_dim=16, time_embed_dim=8, max_sequence_length=8)
    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    with torch.no_grad(), KilnCalls() as calls:
        model(hidden_states=torch.randn(2, 4, 3, 8, 8, generator=g).to(bf16),
              encoder_hidden_states=torch.randn(2, 8, 16, generator=g).to(bf16), timestep=torch.tensor([300, 700]),
              encoder_attention_mask=torch.tensor([[1] * 8, [1] * 5 + [0] * 3]))
    taken = set()
    for op, args in calls:
        x = args[0]
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        elif op == "swiglu":
            assert (len(args) == 1 or args[1] is None) and x.is_contiguous()  # the packed projection
            taken.add((op, x.shape[-1] // 2, 1))
        else:
            assert op == "rope"
            q, k, cos = args[0], args[1], args[2]
            assert q.dim() == k.dim() == 3 and cos.dtype == torch.float32 and cos.shape[-1] * 2 == q.shape[-1]
            taken.add(("rope", q.shape[-1], 1 | 2 | 64 | 128))
    assert taken == {("adaln", 32, 0), ("adaln", 24, 0), ("adaln", 32, 144), ("adaln", 24, 144),
                     ("gated_adaln", 32, 144), ("gated_adaln", 24, 144), ("adaln", 32, 4), ("rms_norm", 16, 1),
                     ("swiglu", 85, 1), ("swiglu", 64, 1), ("rope", 32, 195)}
    assert_prewarmed(taken)


@pytest.mark.parametrize("medium", [False, True])
def test_sd3_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path, medium):
    # A tiny Stable Diffusion 3 (diffusers; with `medium`, SD3.5 Medium's per-head q/k RMSNorms and
    # a dual-attention block), patched and run on the CPU: every kiln call it makes, as each op's
    # dispatcher sees it, is a problem its config's prewarm compiled. The AdaLN modules and the
    # blocks' seams over a LayerNorm with no affine (4), the gated residual in place and, for the
    # dual block's second attention, not (per sample: 8 | 16, 8), the dual norm1's LayerNorm (0),
    # the q/k RMSNorms with their weights (1), the feed-forwards' tanh GELU of a flat row (1).
    import torch
    model = _prewarmed_and_patched(
        tmp_path, "SD3Transformer2DModel", sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=3,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32,
        pooled_projection_dim=12, pos_embed_max_size=16,
        **(dict(qk_norm="rms_norm", dual_attention_layers=(0,)) if medium else {}))
    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    with torch.no_grad(), KilnCalls() as calls:
        model(hidden_states=torch.randn(2, 4, 8, 8, generator=g).to(bf16),
              encoder_hidden_states=torch.randn(2, 7, 24, generator=g).to(bf16),
              pooled_projections=torch.randn(2, 12, generator=g).to(bf16), timestep=torch.tensor([300, 700]))
    taken = {dit_problem(op, args) for op, args in calls}
    expected = {("adaln", 32, 4), ("gated_adaln", 32, 4), ("gated_residual", 32, 24), ("gelu", 128, 1)}
    if medium:
        expected |= {("gated_residual", 32, 8), ("layer_norm", 32, 0), ("rms_norm", 16, 1)}
    assert taken == expected
    assert_prewarmed(taken)


def test_stable_audio3_prewarms_every_call_its_patched_transformer_makes(fresh_cache, tmp_path):
    # A tiny Stable Audio 3 DiT (diffusers), patched and run on the CPU: every kiln call it makes,
    # as each op's dispatcher sees it, is a problem its config's prewarm compiled. Its blocks'
    # seams over its norms scaled by gamma (1: the weight; the last gated residual per sample, in
    # place), its RMSNorms at each head's width (the differential attentions' q/k norms), its
    # feed-forwards' SwiGLU of the packed projection, up first (flat, 1).
    import torch
    model = _prewarmed_and_patched(tmp_path, "StableAudio3DiTModel", io_channels=8, embed_dim=64, depth=2,
                                   num_heads=2, cond_token_dim=16, global_cond_dim=16, local_add_cond_dim=5,
                                   timestep_features_dim=16, num_memory_tokens=4)
    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    with torch.no_grad(), KilnCalls() as calls:
        model(hidden_states=torch.randn(2, 8, 12, generator=g).to(bf16), timestep=torch.tensor([0.2, 0.7]).to(bf16),
              encoder_hidden_states=torch.randn(2, 5, 16, generator=g).to(bf16),
              global_hidden_states=torch.randn(2, 16, generator=g).to(bf16))
    taken = set()
    for op, args in calls:
        if (problem := dit_problem(op, args)) is not None:
            taken.add(problem)
        else:
            assert op == "swiglu" and (len(args) == 1 or args[1] is None)  # the packed projection
            taken.add(("swiglu", args[0].shape[-1] // 2, 1))
    assert taken == {("adaln", 64, 1), ("gated_adaln", 64, 1), ("gated_residual", 64, 24), ("rms_norm", 32, 1),
                     ("swiglu", 256, 1)}
    assert_prewarmed(taken)
