"""``kiln.patch(model)``: the modules of a model that compute what a kiln op computes get a
forward that calls the op; ``kiln.unpatch(model)`` puts the originals back.

What is recognised (by what the module computes, see :mod:`.detect`): RMSNorms (Llama's
rounding rule, Gemma's ``1 + weight``, diffusers' weight-dtype rule, ``nn.RMSNorm``, norms
with no weight, Stable Audio 3's scaled by ``gamma``), LayerNorms over the last dimension
(``nn.LayerNorm`` with or without affine parameters), diffusers' ``GELU`` (``gelu(proj(x))``:
the activation becomes ``kiln.gelu``, the projection stays; on CUDA, without autograd, the tanh
form goes into the projection's cuBLASLt epilogue instead) and gated MLPs
``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU or GELU (the activation and
multiply become ``kiln.swiglu`` / ``kiln.geglu``; the projections stay; Lumina's feed-forward,
``linear_2(silu(linear_1(x)) * linear_3(x))``, too), the same with gate
and up packed in one projection (Phi-3's and GLM-4's ``gate_up_proj``, diffusers' ``GEGLU``
and ``SwiGLU``, FLUX.2's ``Flux2SwiGLU`` with no projection of its own: the op reads the packed
tensor, see :mod:`.packed_gate`), the two-layer GELU MLPs
of vision towers ``fc2(gelu(fc1(x)))`` (SigLIP's, Qwen3-VL's: see :mod:`.gelu_mlp`), the experts of
transformers' MoE layers (their ``_apply_gate`` over every routed token's packed gate_up, see
:mod:`.experts_gate`; GPT-OSS's clamped gate over interleaved pairs as one
``kiln.clamped_swiglu``; Llama 4's, batched matmuls over one packed gate_up parameter, see
:mod:`.bmm_experts`), and transformers'
attentions whose forward calls ``apply_rotary_pos_emb`` (q and k rotated by one
``kiln.rope``, see :mod:`.rope_attention`; where the forward RMS-normalises each head of q
and k right before, as Qwen3's and Gemma 3's do, norms and rotation as one
``kiln.head_norm_rope``, see :mod:`.head_norm_attention`; the vision towers' attentions that
call ``apply_rotary_pos_emb_vision``, Qwen2.5-VL's, Qwen3-VL's and GLM-4V's among them: see
:mod:`.vision_rope`), and decoder layers that add a
block's output to the residual stream and RMS-normalise the sum (one
``kiln.fused_add_rms_norm``, see :mod:`.residual_norm_layer`), and the gated RMSNorms that close
the linear attention of Qwen3-Next, Qwen3.5 and their kin and the Mamba-2 mixers of Bamba,
Granite 4.0-H and Nemotron-H (one ``kiln.rms_norm_gated``, see :mod:`.gated_norm`; grouped
under ``rms_norm`` in ``ops``). For diffusion
transformers (see :mod:`.detect_dit`): LTX-Video's attention processor (q/k RMSNorm and RoPE
as one ``kiln.rms_norm_rope``, its rotary embedding tagged with the grid so the angles are
computed in the kernel, and its tables built only if something reads them), its block's
AdaLN and gated-residual seams (``kiln.adaln``, ``kiln.gated_residual``,
``kiln.gated_adaln``, also across consecutive blocks: see :mod:`.dit_block_chain`), FLUX's attention processor (q and k rotated
by one ``kiln.rope``), FLUX's blocks (their seams as ``kiln.gated_adaln`` and
``kiln.gated_residual``, the single blocks' activation written into ``proj_out``'s input: see
:mod:`.flux_block`), Qwen-Image's attention processor and blocks (each stream's q/k norms and
complex rotation as one ``kiln.head_norm_rope_``, the seams as ``kiln.adaln``,
``kiln.gated_adaln`` and ``kiln.gated_residual_``: see :mod:`.qwen_image`), LTX-2's attention
processors and audio-video blocks (q and k rotated by ``kiln.rope``, each stream's seams as
``kiln.adaln``, ``kiln.gated_adaln`` and ``kiln.gated_residual_``: see :mod:`.ltx2`), Z-Image's
attention processor, feed-forward and modulated blocks (per-head q/k norms and complex rotation as
one ``kiln.head_norm_rope``, ``kiln.swiglu``, the seams as ``kiln.adaln``, ``kiln.gated_adaln`` and
``kiln.gated_residual_``: see :mod:`.z_image`), HunyuanVideo's, HunyuanVideo 1.5's and
HunyuanImage 2.1's attention processors and blocks (the video tokens' per-head q/k norms and
rotation as one ``kiln.head_norm_rope_``, FLUX's block seams: see :mod:`.hunyuan_video`), Mochi's
attention processor and blocks (q and k rotated by per-head tables in one ``kiln.rope``, the valid
text tokens found once a forward, the modulated RMSNorm seams as ``kiln.adaln`` and
``kiln.gated_adaln``: see :mod:`.mochi`), CogVideoX-5b's attention processor (the video tokens'
rotation as one ``kiln.rope_``: see :mod:`.cogvideox_attention`), SD3's and SD3.5's joint blocks
(FLUX's seams: see :mod:`.sd3_block`), Chroma's blocks and pruned AdaLN modules (FLUX's seams, the
modulation rows the model hands each block read in place: see :mod:`.chroma`), FLUX.3's attention
processor (its fp32 per-head q/k norms and rotation as one ``kiln.head_norm_rope``: see
:mod:`.flux3`), its blocks, modulation heads and output norm (the seams as ``kiln.adaln`` and
``kiln.gated_residual``, the modulation projected one row a sample: see :mod:`.flux3_block` and
:mod:`.flux3_model`), Stable Audio 3's blocks (the seams of its gamma-scaled norms and
``sigmoid(1 - gate)`` gates as ``kiln.adaln``, ``kiln.gated_adaln`` and ``kiln.gated_residual_``:
see :mod:`.stable_audio3`) and diffusers' AdaLN modules (``kiln.adaln``). A patched forward whose
kiln ops have no backward (LTX-Video's fused seams) calls the original where it would record
an autograd graph.
"""

import contextlib
import functools
from typing import Iterable, Optional

import torch

from . import (bmm_experts, detect, detect_chroma, detect_cogvideox, detect_dit, detect_flux2, detect_flux3,
               detect_hunyuan_video, detect_ltx2, detect_mochi, detect_qwen_image, detect_sd3, detect_stable_audio3,
               detect_z_image, dit_block_chain, experts_gate, gated_norm, gelu_mlp, head_norm_attention, ltx,
               packed_gate, replace, residual_norm_chain, residual_norm_layer, rope_attention, wan_block)
from .report import Left, PatchReport, Replaced

# The attentions whose processor is replaced, and those of them whose head norms may join the rotation.
_NORM_FUSING = (detect_dit.classify_flux_attention, detect_dit.classify_wan_attention,
                detect_qwen_image.classify_attention, detect_flux2.classify_parallel_attention,
                detect_ltx2.classify_attention, detect_z_image.classify_attention,
                detect_hunyuan_video.classify_attention, detect_flux3.classify_attention,
                detect_qwen_image.classify_attention21)
_PROCESSORS = (detect_dit.classify_ltx_attention, detect_mochi.classify_attention,
               detect_cogvideox.classify_attention) + _NORM_FUSING

OPS = ("rms_norm", "layer_norm", "gelu", "swiglu", "geglu", "clamped_swiglu", "rms_norm_rope", "rope", "adaln")


def _check_ops(ops: Optional[Iterable[str]]) -> frozenset:
    if ops is None:
        return frozenset(OPS)
    if isinstance(ops, str):
        ops = (ops,)
    chosen = frozenset(ops)
    unknown = sorted(chosen - set(OPS))
    if unknown:
        raise ValueError(f"kiln.patch: ops: expected names among {list(OPS)}, got {unknown}")
    return chosen


def patch(model: torch.nn.Module, ops: Optional[Iterable[str]] = None) -> PatchReport:
    """Replaces, in place, the forward of each module of ``model`` that computes what one
    of ``ops`` (default: all of ``kiln.patching.OPS``) computes; returns what was replaced
    and which candidates were left, why. Patching a patched module again changes nothing
    (it is listed again). Works before or after accelerate's hooks: a hooked module's inner
    forward (``_old_forward``) is the one replaced, so the hook still runs around it."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"kiln.patch: model: expected a torch.nn.Module, got {type(model).__name__}")
    chosen = _check_ops(ops)
    report = PatchReport()
    # The probes are CPU tensors made without a device: a default device set by the caller
    # (torch.set_default_device("cuda")) is not theirs. (Only then: the device's mode sees
    # every torch call the probes make, and slows them severalfold.)
    on_cpu = torch.get_default_device().type == "cpu"
    # The probes' stand-in modules initialise their weights from torch's global generator: a
    # seeded run (the latents, a LoRA's initial weights) draws what it draws without kiln.
    with detect.probing_once(), contextlib.nullcontext() if on_cpu else torch.device("cpu"), \
            torch.random.fork_rng(devices=[]):
        _patch_modules(model, chosen, report)
    for block_ops in (ltx.BLOCK_OPS, wan_block.BLOCK_OPS):
        dit_block_chain.link(model, functools.partial(_is_patched_block, block_ops=block_ops))
    residual_norm_chain.link(model)
    return report


def _patch_modules(model: torch.nn.Module, chosen: frozenset, report: PatchReport) -> None:
    for path, module in model.named_modules():
        state = replace.state_of(module)
        if state is not None:
            report.replaced.append(Replaced(path, state.kind, state.op))
            continue
        if _patch_dit(path, module, chosen, report):
            continue
        if experts_gate.candidate(module):
            classify = experts_gate.classify
        elif bmm_experts.candidate(module):
            classify = bmm_experts.classify
        elif gated_norm.candidate(module):
            classify = gated_norm.classify
        elif detect.norm_candidate(module):
            classify = detect.classify_norm
        elif detect.mlp_candidate(module):
            classify = detect.classify_mlp
        elif packed_gate.candidate(module):
            classify = packed_gate.classify
        elif detect.gelu_candidate(module):
            classify = detect.classify_gelu
        elif gelu_mlp.candidate(module):
            classify = gelu_mlp.classify
        elif rope_attention.candidate(module):
            classify = rope_attention.classify
        elif residual_norm_layer.candidate(module):
            classify = residual_norm_layer.classify
        else:
            continue
        cls = type(module).__name__
        original = replace.inner_forward(module)
        with replace.hooks_bypassed(module):
            result = classify(module, original)
            if classify is rope_attention.classify and isinstance(result, detect.Match) and "rms_norm" in chosen:
                result = head_norm_attention.fuse(module, result)
        if isinstance(result, detect.NoMatch):
            report.left.append(Left(path, cls, result.reason))
        elif (result.family or result.op) not in chosen:
            report.left.append(Left(path, cls, f"computes {result.kind}; {result.family or result.op} is not in ops"))
        else:
            replace.install(module, original, result.factory, result.kind, result.op, result.method)
            report.replaced.append(Replaced(path, result.kind, result.op))


def _is_patched_block(module: torch.nn.Module, block_ops: str) -> bool:
    state = replace.state_of(module)
    return isinstance(state, replace.PatchState) and state.op == block_ops


def _patch_dit(path: str, module: torch.nn.Module, chosen: frozenset, report: PatchReport) -> bool:
    """The diffusion-transformer patterns (:mod:`.detect_dit`); True if the module was one
    of their candidates (replaced or left)."""
    candidates = detect_flux2.CANDIDATES + detect_flux3.CANDIDATES + detect_hunyuan_video.CANDIDATES \
        + detect_mochi.CANDIDATES + detect_cogvideox.CANDIDATES + detect_sd3.CANDIDATES + detect_chroma.CANDIDATES \
        + detect_ltx2.CANDIDATES + detect_z_image.CANDIDATES + detect_dit.CANDIDATES + detect_qwen_image.CANDIDATES \
        + detect_stable_audio3.CANDIDATES
    for candidate, classify in candidates:
        if candidate(module):
            break
    else:
        return False
    cls = type(module).__name__
    original = module.processor if classify in _PROCESSORS else replace.inner_forward(module)
    with replace.hooks_bypassed(module):
        if classify in _NORM_FUSING:
            # The head norms join the rotation only where rms_norm is patched too, as in transformers' attentions.
            result = classify(module, original, fuse_norms="rms_norm" in chosen)
        else:
            result = classify(module, original)
    if isinstance(result, detect.NoMatch):
        report.left.append(Left(path, cls, result.reason))
    elif result.family not in chosen:
        report.left.append(Left(path, cls, f"computes {result.kind}; {result.family} is not in ops"))
    else:
        if result.target == "processor":
            replace.install_processor(module, result.factory(original), result.kind, result.op)
        else:
            replace.install(module, original, result.factory, result.kind, result.op)
        report.replaced.append(Replaced(path, result.kind, result.op))
    return True


def unpatch(model: torch.nn.Module) -> int:
    """Puts back the original forward of every module :func:`patch` replaced; returns how
    many. The model computes bit for bit what it did before the patch."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"kiln.unpatch: model: expected a torch.nn.Module, got {type(model).__name__}")
    dit_block_chain.unlink(model)
    residual_norm_chain.unlink(model)
    return sum(replace.uninstall(module, path) for path, module in model.named_modules())


__all__ = ["Left", "OPS", "PatchReport", "Replaced", "patch", "unpatch"]
