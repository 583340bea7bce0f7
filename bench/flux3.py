"""FLUX.3 (diffusers' Flux3Transformer2DModel), bf16 with its q/k norms in fp32 as diffusers'
loader keeps them, random weights, one denoising step: 512 text tokens and a 1024x1024 image
(64 x 64 = 4096 packed latent tokens) unless told otherwise, in the four settings of
bench/llama.py (eager, eager + kiln, torch.compile and torch.compile + kiln, compiled by block as
diffusers' compile_repeated_blocks does), at the transformer's default widths (24 heads of 128,
5 per-mode blocks a mode, 28 joint blocks).

What kiln.patch replaces there: each attention's fp32 per-head q/k RMSNorms and rotation (one
head_norm_rope of q and k), the blocks' seams (adaln, the attention's output added in the
feed-forward's output projection, gated_residual), the modulation heads and the output norm
projecting one row a sample of the expanded timestep embeddings, the LayerNorms and the
feed-forwards' packed SwiGLU. Two more settings: "eager+kiln, blocks apart" leaves the blocks,
the modulation heads, the output norm and the transformer's forward to diffusers (kiln's
attentions, norms and SwiGLU: what the seams and the per-sample modulation give), and "eager+kiln,
FLUX.3 apart" the attention processors too (what the fused q/k work gives on top).

Usage: python bench/flux3.py [--out DIR] [--quick] [--layers N] [--single-layers N] [--height H]
       [--width W] [--reference] [--settings ...] [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/flux3-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
TEXT_TOKENS = 512
FULL = dict(in_channels=128, cond_in_channels=128, num_layers=5, num_single_layers=28, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=20480, axes_dims_rope=(32, 32, 32, 32))
TINY = dict(in_channels=8, cond_in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=24, timestep_channels=16, axes_dims_rope=(4, 4, 4, 4))
TINY_TEXT_TOKENS = 5


def build_model(layers=0, single_layers=None, tiny=False, device="cuda", seed=0):
    """The transformer in bf16 (built in bf16), its q/k norms' weights in fp32 as from_pretrained
    keeps them (``_keep_in_fp32_modules``) with a random spread (they start at 1)."""
    config = dict(TINY) if tiny else dict(FULL, num_layers=layers or FULL["num_layers"],
                                          num_single_layers=FULL["num_single_layers"] if single_layers is None
                                          else single_layers)
    model = common.bf16_diffusers_model("Flux3Transformer2DModel", config, device, seed)
    for name, p in model.named_parameters():
        if any(k in name.split(".") for k in model._keep_in_fp32_modules):
            p.data = p.data.float()
    return model


def _ids(rows, cols, t=0.0):
    """(t, row, column, 0) a token of a rows x cols grid."""
    grid = torch.stack(torch.meshgrid(torch.arange(rows * 1.0), torch.arange(cols * 1.0), indexing="ij"), -1)
    ids = torch.zeros(rows * cols, 4)
    ids[:, 0], ids[:, 1:3] = t, grid.reshape(-1, 2)
    return ids


def build_inputs(config, height, width, device="cuda", tiny=False, reference=False, seed=1):
    """The transformer's keyword arguments at one step (t = 0.5), batch 1: packed latents of a
    height x width image (the VAE's 16x, 2x2 patches packed), ids (t, row, column, layer) a token,
    the text's (0, 0, 0, position); with ``reference``, a reference image of the same size at t = 1."""
    rows, cols = (3, 4) if tiny else (height // 16, width // 16)
    text = TINY_TEXT_TOKENS if tiny else TEXT_TOKENS
    g = torch.Generator("cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=BF16)

    text_ids = torch.zeros(text, 4)
    text_ids[:, 3] = torch.arange(text * 1.0)
    kwargs = dict(hidden_states=randn(1, rows * cols, config["in_channels"]),
                  encoder_hidden_states=randn(1, text, config["joint_attention_dim"]),
                  timestep=torch.full((1,), 0.5, device=device, dtype=BF16),
                  img_ids=_ids(rows, cols).to(device), txt_ids=text_ids.to(device), return_dict=False)
    if reference:
        kwargs.update(image_cond_hidden_states=randn(1, rows * cols, config["cond_in_channels"]),
                      image_cond_ids=_ids(rows, cols, t=1.0).to(device))
    return kwargs


def apart(kiln, blocks_only):
    """kiln.patch with FLUX.3's blocks, modulation heads, output norm and forward left to
    diffusers, and with ``blocks_only`` False its attention processors too (the norms and SwiGLU
    still kiln's)."""
    from kiln.patching import detect_flux3

    leave = [c for _, c in detect_flux3.CANDIDATES if not blocks_only or c is not detect_flux3.classify_attention]
    return common.patch_leaving(kiln, detect_flux3, leave)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=0, help="per-mode blocks a mode (0: all 5)")
    parser.add_argument("--single-layers", type=int, default=None, help="joint blocks (default: all 28)")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--reference", action="store_true", help="a reference image's tokens too (image editing)")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "flux3")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.layers, args.single_layers, args.tiny, args.device)
    config = dict(model.config)
    kwargs = build_inputs(config, args.height, args.width, args.device, args.tiny, args.reference)
    tokens = kwargs["hidden_states"].shape[1] * (2 if args.reference else 1)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"FLUX.3-shaped transformer: {billions:.2f}B parameters, {config['num_layers']} per-mode blocks a mode and "
          f"{config['num_single_layers']} joint blocks, {tokens} image + {kwargs['txt_ids'].shape[0]} text tokens, "
          f"built in {time.perf_counter() - started:.1f} s", flush=True)
    blocks = [b for mode in model.mode_blocks.values() for b in mode] + list(model.txt_mode_blocks) \
        + list(model.single_transformer_blocks)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(blocks),
        variants={"eager+kiln, blocks apart": apart(kiln, True), "eager+kiln, FLUX.3 apart": apart(kiln, False)}
        if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16 (q/k norms fp32)", "image": [args.height, args.width],
                "image_tokens": tokens, "reference_image": args.reference, "text_tokens": kwargs["txt_ids"].shape[0],
                "parameters_billions": billions, "config": config, "settings": records,
                "patch": common.patch_summary(report)}
    common.finish_model_bench(args, "flux3", env, document, markdown(env, document, args), started)
    return document


def markdown(env, document, args):
    versions = env["versions"]
    config = document["config"]
    lines = [
        f"FLUX.3-shaped transformer ({config['num_layers']} per-mode blocks a mode and {config['num_single_layers']} "
        f"joint blocks, {config['num_attention_heads']} heads of {config['attention_head_dim']}, "
        f"{document['parameters_billions']:.1f}B parameters), one step at {args.height}x{args.width} "
        f"({document['image_tokens']} image{' and reference' if args.reference else ''} + "
        f"{document['text_tokens']} text tokens, batch 1), bf16 with the q/k norms in fp32, "
        f"{env['device']} ({env['sm']}), {env['date']}, torch {versions['torch']}, diffusers "
        f"{versions.get('diffusers', '-')}; random weights. ms = median per forward, each call timed alone after at "
        "least 1 s of warm-up calls; host ms = median time the host takes to issue one; speedup of eager+kiln over "
        "eager and of compile+kiln over compile (compiled by block); "
        f"{common.ERRORS}; first call = the compile or kiln's JIT and tuning.",
        "",
    ]
    return "\n".join(lines + common.settings_table(document))


if __name__ == "__main__":
    main()
