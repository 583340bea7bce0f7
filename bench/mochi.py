"""Mochi 1 (diffusers' MochiTransformer3DModel), bf16, random weights: one denoising step of the
transformer in the four settings of bench/llama.py (eager, eager + kiln, torch.compile and
torch.compile + kiln, compiled by block as diffusers' compile_repeated_blocks does), batch 2
(classifier-free guidance, as MochiPipeline runs it): 61 frames at 480x848 (11 x 30 x 53 = 17490
video tokens), prompts padded to 256 tokens, 77 of them valid for the prompt and 1 for the empty
negative prompt. What kiln takes: each attention's rotation by Mochi's per-head tables (one
kiln.rope) and its valid text tokens (found once a forward, sliced, each entry's output written
into one buffer), the q/k RMSNorms, each block's modulated RMSNorm seams (kiln.adaln,
kiln.gated_adaln), the feed-forwards' SwiGLU, the output AdaLN. A fifth setting, "eager+kiln,
blocks apart", leaves the blocks and the attention processors to diffusers (their RMSNorms and
SwiGLUs still kiln's): what those fusions give.

Usage: python bench/mochi.py [--out DIR] [--quick] [--layers N] [--frames N] [--settings ...]
       [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/mochi-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
# Mochi 1: 48 blocks of width 3072 (24 heads of 128), a text stream of 1536; the last block's text
# stream ends at its norm.
CONFIG = dict(patch_size=2, num_attention_heads=24, attention_head_dim=128, num_layers=48, pooled_projection_dim=1536,
              in_channels=12, text_embed_dim=4096, time_embed_dim=256, max_sequence_length=256)
TINY = dict(patch_size=2, num_attention_heads=2, attention_head_dim=16, num_layers=3, pooled_projection_dim=24,
            in_channels=4, text_embed_dim=16, time_embed_dim=8, max_sequence_length=8)
HEIGHT, WIDTH = 480, 848
PROMPT_TOKENS, VALID_TOKENS = 256, (77, 1)  # the prompt's and the empty negative prompt's


def build_model(layers=None, tiny=False, device="cuda", seed=0):
    """The model in bf16, its norms' weights given a random spread (they start at 1) and its
    rotation frequencies random (they start at zero). ``layers``: the blocks (0 or None: all)."""
    import diffusers

    config = dict(TINY if tiny else CONFIG)
    if layers and not tiny:
        config["num_layers"] = layers
    torch.manual_seed(seed)
    with torch.device(device):
        model = diffusers.MochiTransformer3DModel(**config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
            model.pos_frequencies.normal_(0, 0.1)
    return model.to(BF16).eval()


def inputs(model, frames, device="cuda", seed=1):
    """The latents of `frames` frames (Mochi's VAE: 6x in time, 8x in space), the two prompts'
    embeddings and their masks, a timestep; returns (kwargs, video tokens)."""
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    tiny = config.attention_head_dim == 16
    latent = (3, 8, 8) if tiny else ((frames - 1) // 6 + 1, HEIGHT // 8, WIDTH // 8)
    prompt = 8 if tiny else PROMPT_TOKENS
    valid = (8, 5) if tiny else VALID_TOKENS
    mask = (torch.arange(prompt)[None] < torch.tensor(valid)[:, None]).long().to(device)
    kwargs = dict(hidden_states=torch.randn(2, config.in_channels, *latent, device=device, dtype=BF16, generator=g),
                  encoder_hidden_states=torch.randn(2, prompt, config.text_embed_dim, device=device, dtype=BF16,
                                                    generator=g),
                  timestep=torch.tensor([500, 500], device=device), encoder_attention_mask=mask, return_dict=False)
    p = config.patch_size
    return kwargs, latent[0] * (latent[1] // p) * (latent[2] // p)


def blocks_apart(kiln):
    """kiln.patch with the blocks and attention processors left to diffusers (their RMSNorms and
    SwiGLUs patched as such)."""
    from kiln.patching import detect_mochi

    return common.patch_leaving(kiln, detect_mochi)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=6, help="blocks (0: all 48)")
    parser.add_argument("--frames", type=int, default=61, help="the video's frames")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "mochi")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.layers, args.tiny, args.device)
    kwargs, tokens = inputs(model, args.frames, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"Mochi-shaped transformer: {billions:.2f}B parameters, {model.config.num_layers} blocks, {tokens} video "
          f"tokens, built in {time.perf_counter() - started:.1f} s", flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.transformer_blocks)),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "frames": args.frames, "tokens": tokens,
                "config": dict(model.config), "settings": records, "patch": common.patch_summary(report)}
    common.finish_model_bench(args, "mochi", env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config = document["config"]
    heading = (
        f"Mochi-shaped transformer ({config['num_layers']} blocks, {config['num_attention_heads']} heads of "
        f"{config['attention_head_dim']}), one step of {document['frames']} frames at {HEIGHT}x{WIDTH} "
        f"({document['tokens']} video tokens), batch 2 (guidance), prompts of {PROMPT_TOKENS} tokens "
        f"({VALID_TOKENS[0]} and {VALID_TOKENS[1]} valid), bf16, {env['device']} ({env['sm']}), {env['date']}, "
        f"torch {env['versions']['torch']}; random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
