"""Stable Diffusion 3.5 (diffusers' SD3Transformer2DModel), bf16, random weights: one denoising step
of the transformer in the four settings of bench/llama.py (eager, eager + kiln, torch.compile and
torch.compile + kiln, compiled by block as diffusers' compile_repeated_blocks does), batch 2
(classifier-free guidance, as StableDiffusion3Pipeline runs it): a 1024x1024 image (64 x 64 =
4096 latent tokens) and 333 prompt tokens (CLIP's 77 and T5's 256). What kiln takes: each joint
block's seams (kiln.gated_adaln, kiln.gated_residual_; SD3.5 Medium's dual-attention blocks'
first gated residual, kiln.gated_residual), the AdaLN modules, the per-head q/k RMSNorms, the
feed-forwards' GELU. A fifth setting, "eager+kiln, blocks apart", leaves the blocks to diffusers
(their AdaLNs, norms and GELUs still kiln's): what the seams give.

Usage: python bench/sd3.py [--out DIR] [--quick] [--model large|medium] [--layers N] [--settings ...]
       [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/sd3.5-<model>-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
# SD3.5 Large: 38 blocks of 2432 (38 heads of 64); SD3.5 Medium: 24 blocks of 1536 (24 heads of
# 64), its first 13 with a second attention. Both normalise each head of q and k.
MODELS = {
    "large": dict(num_layers=38, num_attention_heads=38, caption_projection_dim=2432, pos_embed_max_size=192),
    "medium": dict(num_layers=24, num_attention_heads=24, caption_projection_dim=1536, pos_embed_max_size=384,
                   dual_attention_layers=tuple(range(13))),
}
COMMON = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, attention_head_dim=64,
              joint_attention_dim=4096, pooled_projection_dim=2048, qk_norm="rms_norm")
TINY = dict(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=3, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32, pooled_projection_dim=12,
            pos_embed_max_size=16, qk_norm="rms_norm", dual_attention_layers=(0,))
SIZE, PROMPT_TOKENS = 1024, 333


def build_model(name, layers=None, tiny=False, device="cuda", seed=0):
    """The model in bf16, its norms' weights given a random spread (they start at 1). ``layers``:
    the blocks (0 or None: all; a dual model keeps its first dual blocks)."""
    import diffusers

    config = dict(TINY) if tiny else dict(COMMON, **MODELS[name])
    if layers and not tiny:
        config["num_layers"] = layers
        if "dual_attention_layers" in config:
            config["dual_attention_layers"] = tuple(i for i in config["dual_attention_layers"] if i < layers - 1)
    torch.manual_seed(seed)
    with torch.device(device):
        model = diffusers.SD3Transformer2DModel(**config)
        with torch.no_grad():
            for name_, p in model.named_parameters():
                if "norm" in name_:
                    p.add_(0.1 * torch.randn_like(p))
    return model.to(BF16).eval()


def inputs(model, device="cuda", seed=1):
    """The latents of one image (VAE: 8x), the prompt's embeddings, pooled projections, a timestep;
    returns (kwargs, image tokens)."""
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    tiny = config.attention_head_dim == 16
    latent = 8 if tiny else SIZE // 8
    prompt = 7 if tiny else PROMPT_TOKENS

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=BF16, generator=g)

    kwargs = dict(hidden_states=randn(2, config.in_channels, latent, latent),
                  encoder_hidden_states=randn(2, prompt, config.joint_attention_dim),
                  pooled_projections=randn(2, config.pooled_projection_dim),
                  timestep=torch.tensor([500, 500], device=device), return_dict=False)
    return kwargs, (latent // config.patch_size) ** 2


def blocks_apart(kiln):
    """kiln.patch with the joint blocks left to diffusers (their AdaLNs, norms and GELUs patched)."""
    from kiln.patching import detect_sd3

    return common.patch_leaving(kiln, detect_sd3)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--model", choices=sorted(MODELS), default="large")
    parser.add_argument("--layers", type=int, default=8, help="blocks (0: all)")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "sd3")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.model, args.layers, args.tiny, args.device)
    kwargs, tokens = inputs(model, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"SD3.5 {args.model}-shaped transformer: {billions:.2f}B parameters, {model.config.num_layers} blocks, "
          f"{tokens} image tokens, built in {time.perf_counter() - started:.1f} s", flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.transformer_blocks)),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "model": args.model, "tokens": tokens,
                "config": dict(model.config), "settings": records, "patch": common.patch_summary(report)}
    common.finish_model_bench(args, f"sd3.5-{args.model}", env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config = document["config"]
    duals = len(config.get("dual_attention_layers") or ())
    heading = (
        f"SD3.5 {document['model']}-shaped transformer ({config['num_layers']} blocks"
        f"{f', {duals} with a second attention' if duals else ''}, {config['num_attention_heads']} heads of "
        f"{config['attention_head_dim']}), one step of a {SIZE}x{SIZE} image ({document['tokens']} image tokens), "
        f"{PROMPT_TOKENS} prompt tokens, batch 2 (guidance), bf16, {env['device']} ({env['sm']}), {env['date']}, "
        f"torch {env['versions']['torch']}; random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
