"""HunyuanVideo (diffusers' HunyuanVideoTransformer3DModel) and HunyuanVideo 1.5
(HunyuanVideo15Transformer3DModel), bf16, random weights: one denoising step of the transformer in
the four settings of bench/llama.py (eager, eager + kiln, torch.compile and torch.compile + kiln,
compiled by block as diffusers' compile_repeated_blocks does), batch 1 (HunyuanVideo is guidance
distilled). HunyuanVideo: 33 frames at 544x960 (9 x 34 x 60 = 18360 video tokens) and a prompt of
256 tokens; ``--model 1.5``: 33 frames at 480x848 (9 x 30 x 53 = 14310 video tokens), a prompt of
256 tokens, 64 of the second text encoder's and an image's 729 (text to video: masked). What kiln
takes: each attention's video-token q/k RMSNorms and rotation (one kiln.head_norm_rope_), the text
tokens' q/k norms, the double blocks' seams (kiln.gated_adaln, kiln.gated_residual_), the single
blocks' (the GELU written into proj_out's input, kiln.gated_residual), the AdaLN modules, the
feed-forwards' GELU, the token refiner's LayerNorms. A fifth setting, "eager+kiln, blocks apart",
leaves the blocks and the attention processors to diffusers (their norms, AdaLNs and GELUs still
kiln's): what those fusions give.

Usage: python bench/hunyuan_video.py [--out DIR] [--quick] [--layers N] [--frames N] [--model 1.5|image]
       [--settings ...] [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/hunyuan-video[-1.5]-<date>-<device>.json (hunyuan-image-... with --model image) and .md;
prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
# HunyuanVideo: 20 double- and 40 single-stream blocks of width 3072 (24 heads of 128). HunyuanVideo
# 1.5: 54 double-stream blocks of width 2048 (16 heads of 128), its latents unpatched.
CONFIGS = {
    "1.0": dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128, num_layers=20,
                num_single_layers=40, num_refiner_layers=2, patch_size=2, patch_size_t=1, text_embed_dim=4096,
                pooled_projection_dim=768, rope_axes_dim=(16, 56, 56)),
    "1.5": dict(in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128, num_layers=54,
                num_refiner_layers=2, text_embed_dim=3584, text_embed_2_dim=1472, image_embed_dim=1152,
                rope_axes_dim=(16, 56, 56)),
    # HunyuanImage 2.1: 20 double- and 40 single-stream blocks of width 3584 (28 heads of 128).
    "image": dict(in_channels=64, out_channels=64, num_attention_heads=28, attention_head_dim=128, num_layers=20,
                  num_single_layers=40, num_refiner_layers=2, text_embed_dim=3584, text_embed_2_dim=1472,
                  rope_axes_dim=(64, 64)),
}
TINY = {"1.0": dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
                    num_single_layers=2, num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=16,
                    pooled_projection_dim=8, rope_axes_dim=(4, 6, 6)),
        "1.5": dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
                    num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=12, image_embed_dim=24,
                    rope_axes_dim=(4, 6, 6)),
        "image": dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
                      num_single_layers=2, num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=12,
                      rope_axes_dim=(8, 8))}
SIZES = {"1.0": (544, 960), "1.5": (480, 848), "image": (2048, 2048)}  # (height, width) in pixels
# The VAE's spatial compression: 8x (HunyuanVideo), 16x (1.5), 32x (HunyuanImage 2.1).
COMPRESSION = {"1.0": 8, "1.5": 16, "image": 32}
PROMPT_TOKENS, BYT5_TOKENS, IMAGE_TOKENS = 256, 64, 729


def build_model(layers=None, tiny=False, device="cuda", seed=0, version="1.0"):
    """The model in bf16, its norms' weights given a random spread (they start at 1). ``layers``:
    the double-stream blocks (HunyuanVideo: twice as many single-stream ones, its proportion)."""
    import diffusers

    cls = {"1.0": diffusers.HunyuanVideoTransformer3DModel, "1.5": diffusers.HunyuanVideo15Transformer3DModel,
           "image": diffusers.HunyuanImageTransformer2DModel}[version]
    config = dict((TINY if tiny else CONFIGS)[version])
    if layers and not tiny:
        config["num_layers"] = layers
        if "num_single_layers" in config:
            config["num_single_layers"] = 2 * layers
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(**config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    return model.to(BF16).eval()


def inputs(model, frames, version, device="cuda", seed=1):
    """The latents of `frames` frames (VAE: 4x in time; 8x in space for HunyuanVideo, 16x for 1.5),
    the prompt's embeddings (all valid), a timestep; returns (kwargs, video tokens)."""
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    tiny = config.attention_head_dim == 16
    height, width = SIZES[version]
    latent = (3, 4, 4) if tiny else ((frames - 1) // 4 + 1, height // COMPRESSION[version],
                                     width // COMPRESSION[version])
    if version == "image":  # one image: no frames
        latent = latent[1:]
    prompt = 7 if tiny else PROMPT_TOKENS

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=BF16, generator=g)

    kwargs = dict(hidden_states=randn(1, config.in_channels, *latent),
                  encoder_hidden_states=randn(1, prompt, config.text_embed_dim),
                  encoder_attention_mask=torch.ones(1, prompt, device=device, dtype=torch.long), return_dict=False)
    if version == "1.0":
        kwargs.update(timestep=torch.tensor([500], device=device),
                      pooled_projections=randn(1, config.pooled_projection_dim),
                      guidance=torch.tensor([6000.0], device=device, dtype=BF16))
    else:
        byt5, image = (5, 3) if tiny else (BYT5_TOKENS, IMAGE_TOKENS)
        kwargs.update(timestep=torch.tensor([500.0], device=device, dtype=BF16),
                      encoder_hidden_states_2=randn(1, byt5, config.text_embed_2_dim),
                      encoder_attention_mask_2=torch.ones(1, byt5, device=device, dtype=torch.long))
        if version == "1.5":
            kwargs["image_embeds"] = torch.zeros(1, image, config.image_embed_dim, device=device, dtype=BF16)
    if version == "image":  # patch_size (1, 1)
        return kwargs, latent[0] * latent[1]
    patch, patch_t = getattr(config, "patch_size", 1), getattr(config, "patch_size_t", 1)
    return kwargs, (latent[0] // patch_t) * (latent[1] // patch) * (latent[2] // patch)


def blocks_apart(kiln):
    """kiln.patch with the blocks and attention processors left to diffusers (their norms, AdaLNs
    and GELUs patched as such)."""
    from kiln.patching import detect_hunyuan_video

    return common.patch_leaving(kiln, detect_hunyuan_video)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=5,
                        help="double-stream blocks (HunyuanVideo: and twice as many single-stream; 0: all)")
    parser.add_argument("--frames", type=int, default=33, help="the video's frames")
    parser.add_argument("--model", choices=sorted(CONFIGS), default="1.0",
                        help="HunyuanVideo's version, or HunyuanImage 2.1 (image)")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "hunyuan_video")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.layers, args.tiny, args.device, version=args.model)
    kwargs, tokens = inputs(model, args.frames, args.model, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    singles = getattr(model.config, "num_single_layers", 0)
    print(f"HunyuanVideo {args.model}-shaped transformer: {billions:.2f}B parameters, {model.config.num_layers} double "
          f"and {singles} single blocks, {tokens} video or image tokens, built in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    blocks = list(model.transformer_blocks) + list(getattr(model, "single_transformer_blocks", []))
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(blocks),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "model": args.model, "frames": args.frames, "tokens": tokens,
                "config": dict(model.config), "settings": records, "patch": common.patch_summary(report)}
    name = {"1.0": "hunyuan-video", "1.5": "hunyuan-video-1.5", "image": "hunyuan-image"}[args.model]
    common.finish_model_bench(args, name, env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config, version = document["config"], document["model"]
    height, width = SIZES[version]
    singles = config.get("num_single_layers", 0)
    text = f"{PROMPT_TOKENS} prompt tokens" + (
        "" if version == "1.0" else f", {BYT5_TOKENS} of the second text encoder" + (
            f", {IMAGE_TOKENS} image tokens (masked)" if version == "1.5" else ""))
    if version == "image":
        model, shape = "HunyuanImage 2.1", f"an image at {height}x{width} ({document['tokens']} image tokens"
    else:
        model = f"HunyuanVideo {version}"
        shape = f"{document['frames']} frames at {height}x{width} ({document['tokens']} video tokens"
    heading = (
        f"{model}-shaped transformer ({config['num_layers']} double-stream and {singles} single-stream "
        f"blocks, {config['num_attention_heads']} heads of {config['attention_head_dim']}), one step of "
        f"{shape}, {text}, batch 1), bf16, "
        f"{env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}; random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
