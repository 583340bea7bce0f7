"""Stable Audio 3 (diffusers' StableAudio3DiTModel), bf16, random weights: one denoising step of the
DiT in the four settings of bench/llama.py (eager, eager + kiln, torch.compile and torch.compile +
kiln, compiled by block as diffusers' compile_repeated_blocks does), batch 2 (the prompt and the
negative prompt, as a pipeline with guidance calls it). What kiln takes: every RMSNorm (scaled by
its gamma: its differential attentions' q/k norms, twice a head), every feed-forward's gate
(``proj_out(h * F.silu(gate))`` over proj_in's packed halves, one kiln.swiglu) and every block's
seams (its pre-norms with their modulation and the ``sigmoid(1 - gate)`` gated residuals: one
kiln.adaln, two kiln.gated_adaln and one kiln.gated_residual_ a block). Under torch.compile the
seams and norms are Inductor's.

diffusers' defaults: 24 blocks of 1536 (24 heads of 64), feed-forward 4x, 64 memory tokens;
--frames audio latents (default 1024: about 47 s of 44.1 kHz audio at the VAE's 2048x) and 128
prompt tokens.

Usage: python bench/stable_audio3.py [--out DIR] [--quick] [--layers N] [--frames N] [--settings ...]
       [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/stable-audio3-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
CONFIG = dict(io_channels=256, embed_dim=1536, depth=24, num_heads=24, cond_token_dim=768, global_cond_dim=768,
              local_add_cond_dim=257, timestep_features_dim=256, ff_mult=4.0, num_memory_tokens=64)
TINY = dict(io_channels=8, embed_dim=64, depth=2, num_heads=2, cond_token_dim=16, global_cond_dim=16,
            local_add_cond_dim=5, timestep_features_dim=16, num_memory_tokens=4)
PROMPT_TOKENS = 128


def build_model(layers=None, tiny=False, device="cuda"):
    config = dict(TINY if tiny else CONFIG)
    if layers and not tiny:
        config["depth"] = layers
    model = common.bf16_diffusers_model("StableAudio3DiTModel", config, device, norm_spread=0.0)
    with torch.no_grad():  # the gammas start at one: a trained model's spread
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def inputs(model, frames, tiny=False, device="cuda", seed=1):
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    frames = 12 if tiny else frames
    text = 5 if tiny else PROMPT_TOKENS
    kwargs = dict(hidden_states=torch.randn(2, config.io_channels, frames, device=device, dtype=BF16, generator=g),
                  timestep=torch.tensor([0.5, 0.5], device=device, dtype=BF16),
                  encoder_hidden_states=torch.randn(2, text, config.cond_token_dim, device=device, dtype=BF16,
                                                    generator=g),
                  global_hidden_states=torch.randn(2, config.global_cond_dim, device=device, dtype=BF16, generator=g),
                  return_dict=False)
    return kwargs, frames, text


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=0, help="blocks of the model (0: all 24)")
    parser.add_argument("--frames", type=int, default=1024, help="audio latent frames")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "stable_audio3")
    layers = args.layers or (4 if args.quick else 0)
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(layers, args.tiny, args.device)
    kwargs, frames, text = inputs(model, args.frames, args.tiny, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"Stable-Audio-3-shaped DiT: {billions:.2f}B parameters, {model.config.depth} blocks, {frames} latent "
          f"frames + {text} prompt tokens, batch 2, built in {time.perf_counter() - started:.1f} s", flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.transformer_blocks)))
    document = {"environment": env, "dtype": "bf16", "frames": frames, "prompt_tokens": text,
                "parameters_billions": billions, "config": dict(model.config), "settings": records,
                "patch": common.patch_summary(report)}
    common.finish_model_bench(args, "stable-audio3", env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config = document["config"]
    heading = (
        f"Stable-Audio-3-shaped DiT ({config['depth']} blocks of {config['embed_dim']}, {config['num_heads']} heads, "
        f"{document['parameters_billions']:.2f}B parameters), one step of {document['frames']} latent frames and "
        f"{document['prompt_tokens']} prompt tokens, batch 2, bf16, {env['device']} ({env['sm']}), {env['date']}, "
        f"torch {env['versions']['torch']}, diffusers {env['versions'].get('diffusers', '-')}; random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
