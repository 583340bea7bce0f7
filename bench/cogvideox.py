"""CogVideoX (diffusers' CogVideoXTransformer3DModel), bf16, random weights: one denoising step
of the transformer in the four settings of bench/llama.py (eager, eager + kiln, torch.compile
and torch.compile + kiln, compiled by block as diffusers' compile_repeated_blocks does), on 49
frames at 480x720 (13 x 30 x 45 = 17550 latent tokens) and 226 text tokens, batch 2 (the
pipeline's classifier-free guidance). What kiln takes there: each block's two
CogVideoXLayerNormZero (an affine LayerNorm of the video and of the text tokens, modulated by
one embedding's chunks: a kiln.adaln a stream, the norm's bias folded into the shift), the
output AdaLayerNorm, each block's seams (a stream each: the attention's gated residual with
norm2's modulation as one kiln.gated_adaln, the feed-forward's gated residual as one
kiln.gated_residual_), the attention's q/k LayerNorms, 5b's rotation of the video tokens' q and k
(one kiln.rope_ in place) and the feed-forward's GELU (tanh). A fifth setting, "eager+kiln,
modulations apart", leaves the AdaLN modules and the blocks' seams to diffusers (their LayerNorms
still kiln's): what those fusions give; for 5b a sixth, "eager+kiln, rotation apart", leaves the
attention processors to diffusers: what the rotation gives.

Usage: python bench/cogvideox.py [--out DIR] [--quick] [--model 2b|5b] [--layers N] [--frames F]
       [--settings ...] [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/cogvideox-<model>-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
# CogVideoX-2b and CogVideoX-5b: 5b rotates q and k (3-D RoPE from the pipeline's tables).
MODELS = {
    "2b": dict(num_attention_heads=30, attention_head_dim=64, num_layers=30, use_rotary_positional_embeddings=False),
    "5b": dict(num_attention_heads=48, attention_head_dim=64, num_layers=42, use_rotary_positional_embeddings=True),
}
COMMON = dict(in_channels=16, out_channels=16, time_embed_dim=512, text_embed_dim=4096, sample_width=90,
              sample_height=60, sample_frames=49, patch_size=2, max_text_seq_length=226)
TINY = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=32,
            text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
            max_text_seq_length=8)
TEXT_TOKENS = 226


def build_model(name, layers=None, tiny=False, device="cuda", seed=0):
    """The model in bf16, its norms' weights and biases given a random spread (they start at 1
    and 0, where a bias folded into the shift would not show)."""
    from diffusers import CogVideoXTransformer3DModel

    rope = MODELS[name]["use_rotary_positional_embeddings"]
    config = dict(TINY, use_rotary_positional_embeddings=rope) if tiny else dict(COMMON, **MODELS[name])
    if layers and not tiny:
        config = dict(config, num_layers=layers)
    torch.manual_seed(seed)
    with torch.device(device):
        model = CogVideoXTransformer3DModel(**config)
        with torch.no_grad():
            for name_, p in model.named_parameters():
                if "norm" in name_:
                    p.add_(0.1 * torch.randn_like(p))
    return model.to(BF16).eval()


def inputs(model, frames, height, width, device="cuda", seed=1):
    """Latents of `frames` frames at height x width (VAE: 4x in time, 8x in space), the text's
    embeddings, a timestep; with the 5b model's 3-D RoPE tables as its pipeline makes them."""
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    latent_frames, h, w = (frames - 1) // 4 + 1, height // 8, width // 8
    text = 8 if config.max_text_seq_length == 8 else TEXT_TOKENS
    kwargs = dict(hidden_states=torch.randn(2, latent_frames, config.in_channels, h, w, device=device, dtype=BF16,
                                            generator=g),
                  encoder_hidden_states=torch.randn(2, text, config.text_embed_dim, device=device, dtype=BF16,
                                                    generator=g),
                  timestep=torch.tensor([500, 500], device=device), return_dict=False)
    if config.use_rotary_positional_embeddings:
        from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid
        from diffusers.models.embeddings import get_3d_rotary_pos_embed

        p = config.patch_size
        grid = (h // p, w // p)
        crops = get_resize_crop_region_for_grid(grid, config.sample_width // p, config.sample_height // p)
        cos, sin = get_3d_rotary_pos_embed(config.attention_head_dim, crops, grid, latent_frames, device=device)
        kwargs["image_rotary_emb"] = (cos, sin)
    return kwargs, latent_frames * (h // config.patch_size) * (w // config.patch_size)


def modulations_apart(kiln):
    """kiln.patch with the AdaLN modules and the blocks' seams left to diffusers, their LayerNorms
    patched as norms (the patch before kiln.adaln took a LayerNorm's bias)."""
    from kiln.patching import detect_dit

    return common.patch_leaving(kiln, detect_dit, (detect_dit.classify_layer_norm_zero, detect_dit.classify_adaln,
                                                   detect_dit.classify_cogvideox_block))


def rotation_apart(kiln):
    """kiln.patch with the attention processors left to diffusers (5b's rotation diffusers')."""
    from kiln.patching import detect_cogvideox

    return common.patch_leaving(kiln, detect_cogvideox)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--model", choices=sorted(MODELS), default="2b")
    parser.add_argument("--layers", type=int, default=0, help="blocks of the model (default: all of them)")
    parser.add_argument("--frames", type=int, default=49)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=720)
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "cogvideox")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.model, args.layers, args.tiny, args.device)
    frames, height, width = (5, 64, 64) if args.tiny else (args.frames, args.height, args.width)
    kwargs, tokens = inputs(model, frames, height, width, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"CogVideoX {args.model}-shaped transformer: {billions:.2f}B parameters, {model.config.num_layers} blocks, "
          f"{tokens} video tokens, built in {time.perf_counter() - started:.1f} s", flush=True)
    variants = None
    if "eager+kiln" in settings:
        variants = {"eager+kiln, modulations apart": modulations_apart(kiln)}
        if model.config.use_rotary_positional_embeddings:
            variants["eager+kiln, rotation apart"] = rotation_apart(kiln)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.transformer_blocks)), variants=variants)
    document = {"environment": env, "dtype": "bf16", "frames": frames, "height": height, "width": width,
                "tokens": tokens, "config": dict(model.config), "settings": records,
                "patch": common.patch_summary(report)}
    common.finish_model_bench(args, f"cogvideox-{args.model}", env, document, markdown(env, document, args),
                              started)
    return document


def markdown(env, document, args):
    config = document["config"]
    heading = (
        f"CogVideoX {args.model}-shaped transformer ({config['num_layers']} blocks, {config['num_attention_heads']} "
        f"heads of {config['attention_head_dim']}), one step of {document['frames']} frames at "
        f"{document['height']}x{document['width']} ({document['tokens']} video tokens, batch 2), bf16, "
        f"{env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}; random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
