"""Qwen-Image (diffusers' QwenImageTransformer2DModel), bf16, random weights: one denoising step
of the transformer in the four settings of bench/llama.py (eager, eager + kiln, torch.compile
and torch.compile + kiln, compiled by block as diffusers' compile_repeated_blocks does), on a
1024x1024 image (64 x 64 = 4096 latent tokens) and 128 text tokens, batch 1 (the pipeline's
true classifier-free guidance calls the transformer once for the prompt and once for the
negative prompt). With --edit, Qwen-Image-Edit-2511's form: a condition image's 4096 tokens
after the target's, modulated per token by the zero timestep (``zero_cond_t``). What kiln takes
there: each block's modulated norms (kiln.adaln), its seams (a stream each: the attention's
gated residual with norm2's modulation as one kiln.gated_adaln, the feed-forward's gated
residual as one kiln.gated_residual_), the attention's per-head q/k RMSNorms and complex
rotation (one kiln.head_norm_rope_ a stream), the text input's RMSNorm, the output AdaLN and
the feed-forwards' GELU (tanh). A fifth setting, "eager+kiln, blocks apart", leaves the blocks
and the attention processors to diffusers (their norms and GELUs still kiln's): what those
fusions give.

Usage: python bench/qwen_image.py [--out DIR] [--quick] [--layers N] [--size PX] [--edit]
       [--settings ...] [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/qwen-image[-edit]-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
# Qwen-Image's transformer: 60 blocks of width 3072 (24 heads of 128).
CONFIG = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
              num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56))
TINY = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
            joint_attention_dim=32, axes_dims_rope=(4, 6, 6))
TEXT_TOKENS = 128


def build_model(layers=None, tiny=False, edit=False, device="cuda", seed=0):
    """The model in bf16, its norms' weights given a random spread (they start at 1)."""
    from diffusers import QwenImageTransformer2DModel

    config = dict(TINY if tiny else CONFIG, zero_cond_t=edit)
    if layers and not tiny:
        config["num_layers"] = layers
    torch.manual_seed(seed)
    with torch.device(device):
        model = QwenImageTransformer2DModel(**config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    return model.to(BF16).eval()


def inputs(model, size, edit=False, device="cuda", seed=1):
    """Packed latents of a size x size image (VAE 8x, then 2 x 2 patches), with --edit a
    condition image's after them, the text's embeddings and mask, a timestep."""
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    side = size // 16
    images = 2 if edit else 1
    text = 8 if config.joint_attention_dim == 32 else TEXT_TOKENS
    kwargs = dict(hidden_states=torch.randn(1, images * side * side, config.in_channels, device=device, dtype=BF16,
                                            generator=g),
                  encoder_hidden_states=torch.randn(1, text, config.joint_attention_dim, device=device, dtype=BF16,
                                                    generator=g),
                  encoder_hidden_states_mask=torch.ones(1, text, dtype=torch.long, device=device),
                  timestep=torch.tensor([0.5], device=device, dtype=BF16), img_shapes=[[(1, side, side)] * images],
                  return_dict=False)
    return kwargs, images * side * side


def blocks_apart(kiln):
    """kiln.patch with the blocks and attention processors left to diffusers (their norms and
    GELUs patched as such)."""
    from kiln.patching import detect_qwen_image

    return common.patch_leaving(kiln, detect_qwen_image)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=10, help="blocks of the model (0: all 60)")
    parser.add_argument("--size", type=int, default=1024, help="the image's side in pixels")
    parser.add_argument("--edit", action="store_true", help="Qwen-Image-Edit-2511's form: a condition image too")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "qwen_image")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.layers, args.tiny, args.edit, args.device)
    kwargs, tokens = inputs(model, 64 if args.tiny else args.size, args.edit, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    name = "qwen-image-edit" if args.edit else "qwen-image"
    print(f"Qwen-Image{'-Edit' if args.edit else ''}-shaped transformer: {billions:.2f}B parameters, "
          f"{model.config.num_layers} blocks, {tokens} image tokens, built in {time.perf_counter() - started:.1f} s",
          flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.transformer_blocks)),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "size": args.size, "edit": args.edit, "tokens": tokens,
                "config": dict(model.config), "settings": records, "patch": common.patch_summary(report)}
    common.finish_model_bench(args, name, env, document, markdown(env, document, args), started)
    return document


def markdown(env, document, args):
    config = document["config"]
    form = "an edit (target and condition image, per-token modulation)" if document["edit"] else "one image"
    heading = (
        f"Qwen-Image-shaped transformer ({config['num_layers']} blocks, {config['num_attention_heads']} heads of "
        f"{config['attention_head_dim']}), one step of {form} at {document['size']}x{document['size']} "
        f"({document['tokens']} image tokens, {TEXT_TOKENS} text tokens, batch 1), bf16, {env['device']} "
        f"({env['sm']}), {env['date']}, torch {env['versions']['torch']}; random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
