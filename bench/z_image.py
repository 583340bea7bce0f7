"""Z-Image (diffusers' ZImageTransformer2DModel: Z-Image, Z-Image-Turbo), bf16, random weights: one
denoising step of the transformer in the four settings of bench/llama.py (eager, eager + kiln,
torch.compile and torch.compile + kiln, compiled by block as diffusers' compile_repeated_blocks
does), on a 1024x1024 image (64 x 64 = 4096 latent tokens) and a caption of 256 tokens, batch 1
(Z-Image-Turbo runs without classifier-free guidance). What kiln takes: each modulated block's
seams (norm1's modulation as kiln.adaln; the attention's gated residual with the feed-forward's
modulated norm as one kiln.gated_adaln; the feed-forward's gated residual as kiln.gated_residual_),
every attention's per-head q/k RMSNorms and complex rotation (one kiln.head_norm_rope), every
feed-forward's gating (kiln.swiglu), the sublayers' output RMSNorms, the caption embedder's RMSNorm
and the final LayerNorm. A fifth setting, "eager+kiln, blocks apart", leaves the blocks, the
attention processors and the feed-forwards to diffusers (their norms still kiln's): what those
fusions give.

Usage: python bench/z_image.py [--out DIR] [--quick] [--layers N] [--size PX] [--settings ...]
       [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/z-image-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
# Z-Image's transformer: 30 blocks of width 3840 (30 heads of 128), two refiner blocks of each kind.
CONFIG = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=3840, n_layers=30, n_refiner_layers=2,
              n_heads=30, n_kv_heads=30, cap_feat_dim=2560, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512])
TINY = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=2, n_refiner_layers=1,
            n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6], axes_lens=[64, 16, 16])
CAPTION_TOKENS = 256


def build_model(layers=None, tiny=False, device="cuda", seed=0):
    """The model in bf16, its norms' weights given a random spread (they start at 1)."""
    from diffusers import ZImageTransformer2DModel

    config = dict(TINY if tiny else CONFIG)
    if layers and not tiny:
        config["n_layers"] = layers
    torch.manual_seed(seed)
    with torch.device(device):
        model = ZImageTransformer2DModel(**config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    return model.to(BF16).eval()


def inputs(model, size, device="cuda", seed=1):
    """The latents of a size x size image (VAE 8x), a caption's embeddings, a timestep."""
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    tiny = config.dim == 32
    side = 8 if tiny else size // 8
    caption = 7 if tiny else CAPTION_TOKENS
    kwargs = dict(x=[torch.randn(config.in_channels, 1, side, side, device=device, dtype=BF16, generator=g)],
                  t=torch.tensor([0.5], device=device, dtype=BF16),
                  cap_feats=[torch.randn(caption, config.cap_feat_dim, device=device, dtype=BF16, generator=g)],
                  return_dict=False)
    return kwargs, (side // 2) ** 2


def blocks_apart(kiln):
    """kiln.patch with the blocks, attention processors and feed-forwards left to diffusers (their
    norms patched as such)."""
    from kiln.patching import detect_z_image

    return common.patch_leaving(kiln, detect_z_image)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=10, help="main blocks of the model (0: all 30)")
    parser.add_argument("--size", type=int, default=1024, help="the image's side in pixels")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "z_image")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.layers, args.tiny, args.device)
    kwargs, tokens = inputs(model, args.size, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"Z-Image-shaped transformer: {billions:.2f}B parameters, {model.config.n_layers} main blocks, {tokens} "
          f"image tokens, built in {time.perf_counter() - started:.1f} s", flush=True)
    blocks = list(model.noise_refiner) + list(model.context_refiner) + list(model.layers)
    records, report = common.run_model_settings(
        model, lambda fn: torch.stack(fn(**kwargs)[0]), kiln, settings=settings,
        reps=args.reps or (3 if args.quick else 10), compile_fn=common.compile_blocks(blocks),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "size": args.size, "tokens": tokens, "config": dict(model.config),
                "settings": records, "patch": common.patch_summary(report)}
    common.finish_model_bench(args, "z-image", env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config = document["config"]
    heading = (
        f"Z-Image-shaped transformer ({config['n_layers']} main blocks and {config['n_refiner_layers']} refiner blocks "
        f"of each kind, {config['n_heads']} heads of {config['dim'] // config['n_heads']}), one step at "
        f"{document['size']}x{document['size']} ({document['tokens']} image tokens, {CAPTION_TOKENS} caption tokens, "
        f"batch 1), bf16, {env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}; random "
        "weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
