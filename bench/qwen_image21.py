"""Qwen-Image 2.1 (diffusers' QwenImage21Transformer2DModel), bf16, random weights: one denoising
step of the transformer in the four settings of bench/llama.py (eager, eager + kiln, torch.compile
and torch.compile + kiln, compiled by block as diffusers' compile_repeated_blocks does), text to
image at 1024x1024 (64 x 64 = 4096 target image tokens) after a prompt of 512 tokens, batch 1,
with diffusers' default attention processor (the prompt's segments, then the image, by SDPA) and
the model's default causal_condition (the prompt's tokens modulated from t = 0, the image's from
the step's t: modulation per token). What kiln takes: each block's seams (norm1's modulation as
kiln.adaln; the attention's gated residual with the feed-forward's modulated norm as one
kiln.gated_adaln; the feed-forward's gated residual as kiln.gated_residual_) from the scales and
activated gates derived once a forward, every attention's per-head q/k RMSNorms and complex rotation
(one kiln.head_norm_rope), every feed-forward's gating (kiln.swiglu) and the text's RMSNorm. A fifth
setting, "eager+kiln, blocks apart", leaves the blocks and their attention processors to diffusers
(the q/k norms kiln's modules): what those give.

Usage: python bench/qwen_image21.py [--out DIR] [--quick] [--layers N] [--size PX] [--settings ...]
       [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/qwen-image21-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
# diffusers' defaults, Qwen-Image 2.1's: 32 blocks of width 4096 (32 heads of 128), feed-forward 3x.
CONFIG = dict(patch_size=1, in_channels=64, out_channels=64, num_layers=32, attention_head_dim=128,
              num_attention_heads=32, context_in_dim=4096, mlp_ratio=3, axes_dims_rope=(16, 56, 56))
TINY = dict(patch_size=1, in_channels=8, out_channels=8, num_layers=2, attention_head_dim=16, num_attention_heads=2,
            context_in_dim=24, mlp_ratio=2, axes_dims_rope=(4, 6, 6))
PROMPT_TOKENS = 512


def build_model(layers=None, tiny=False, device="cuda"):
    config = dict(TINY if tiny else CONFIG)
    if layers and not tiny:
        config["num_layers"] = layers
    return common.bf16_diffusers_model("QwenImage21Transformer2DModel", config, device)


def inputs(model, size, device="cuda", seed=1):
    """The target image's latents (a size x size image: 16x fewer tokens a side), the prompt's
    embeddings, and where the vision-language sequence holds the image's slots (each a 2x2 group
    of latent tokens after the prompt)."""
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    tiny = config.num_layers == 2 and config.attention_head_dim == 16
    side = 4 if tiny else size // 16
    text = 7 if tiny else PROMPT_TOKENS
    tokens = side * side
    img_mask = torch.cat([torch.zeros(1, text, dtype=torch.bool), torch.ones(1, tokens // 4, dtype=torch.bool)], 1)
    kwargs = dict(hidden_states=torch.randn(1, tokens, config.in_channels, device=device, dtype=BF16, generator=g),
                  encoder_hidden_states=torch.randn(1, text, config.context_in_dim, device=device, dtype=BF16,
                                                    generator=g),
                  timestep=torch.tensor([0.5], device=device, dtype=BF16), img_shapes=[[(1, side, side)]],
                  img_mask=img_mask.to(device), return_dict=False)
    return kwargs, tokens, text


def blocks_apart(kiln):
    """kiln.patch with Qwen-Image 2.1's blocks and attention processors left to diffusers (their
    feed-forwards and norms still kiln's)."""
    from kiln.patching import detect_qwen_image

    return common.patch_leaving(kiln, detect_qwen_image)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=0, help="blocks of the model (0: all 32)")
    parser.add_argument("--size", type=int, default=1024, help="the image's side in pixels")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "qwen_image21")
    layers = args.layers or (4 if args.quick else 0)
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(layers, args.tiny, args.device)
    kwargs, tokens, text = inputs(model, args.size, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"Qwen-Image-2.1-shaped transformer: {billions:.2f}B parameters, {model.config.num_layers} blocks, "
          f"{tokens} image + {text} prompt tokens, built in {time.perf_counter() - started:.1f} s", flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.transformer_blocks)),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "size": args.size, "tokens": tokens, "prompt_tokens": text,
                "parameters_billions": billions, "config": dict(model.config), "settings": records,
                "patch": common.patch_summary(report)}
    common.finish_model_bench(args, "qwen-image21", env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config = document["config"]
    heading = (
        f"Qwen-Image-2.1-shaped transformer ({config['num_layers']} blocks, {config['num_attention_heads']} heads of "
        f"{config['attention_head_dim']}, {document['parameters_billions']:.1f}B parameters), one step at "
        f"{document['size']}x{document['size']} ({document['tokens']} image tokens after {document['prompt_tokens']} "
        f"prompt tokens, batch 1, modulation per token), bf16, {env['device']} ({env['sm']}), {env['date']}, torch "
        f"{env['versions']['torch']}, diffusers {env['versions'].get('diffusers', '-')}; random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
