"""SkyReels-V2 (diffusers' SkyReelsV2Transformer3DModel: Wan's blocks, the self-attention masked
across frame blocks), bf16, random weights, diffusers' fp32 modules kept in fp32 (bench/wan.py's
model), one step of diffusion forcing as SkyReelsV2DiffusionForcingPipeline runs it: a timestep a
latent frame (later frames noisier), so every block modulates each token from [B, 6, S, D] rows.
97 frames at 544x960 (25 x 34 x 60 = 51000 latent tokens; the 540P models) unless told otherwise;
``--causal-block N`` sets the pipeline's causal_block_size (frames attend to their block and the
earlier ones). Four settings of bench/llama.py (eager, eager + kiln, torch.compile and
torch.compile + kiln, compiled by block as diffusers' compile_repeated_blocks does), and "eager+kiln,
blocks apart": the blocks left to diffusers (the attention, norms and GELU still kiln's).

Usage: python bench/skyreels_v2.py [--out DIR] [--quick] [--model 1.3b|14b] [--layers N] [--frames F]
       [--height H] [--width W] [--causal-block N] [--settings ...] [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/skyreels-v2-df-<model>-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import wan  # noqa: E402

BF16 = torch.bfloat16


def inputs(model, shape, device="cuda", seed=1):
    """The latents, a timestep a latent frame falling from 999 (the last frame) to 0 (the first:
    context already denoised), 512 prompt tokens."""
    g = torch.Generator(device).manual_seed(seed)
    frames = shape[2]
    return dict(hidden_states=torch.randn(*shape, device=device, dtype=BF16, generator=g),
                timestep=torch.linspace(0, 999, frames, device=device).long()[None],
                encoder_hidden_states=torch.randn(1, 512, model.config.text_dim, device=device, dtype=BF16,
                                                  generator=g),
                enable_diffusion_forcing=True, return_dict=False)


def blocks_apart(kiln):
    """kiln.patch with the blocks left to diffusers (the attention processors, norms and GELU patched)."""
    from kiln.patching import detect_dit

    return common.patch_leaving(kiln, detect_dit, leave=(detect_dit.classify_wan_block,))


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--model", choices=sorted(wan.MODELS), default="1.3b")
    parser.add_argument("--layers", type=int, default=6, help="blocks (0: all)")
    parser.add_argument("--frames", type=int, default=97)
    parser.add_argument("--height", type=int, default=544)
    parser.add_argument("--width", type=int, default=960)
    parser.add_argument("--causal-block", type=int, default=1, help="frames a causal block (1: no mask)")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "skyreels_v2")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    shape = wan.latent_shape(args.frames, args.height, args.width, args.tiny)
    tokens = shape[2] * (shape[3] // 2) * (shape[4] // 2)
    model = wan.build_model(args.model, args.layers, args.tiny, args.device, cls="SkyReelsV2Transformer3DModel",
                            num_frame_per_block=args.causal_block)
    kwargs = inputs(model, shape, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"SkyReels-V2 {args.model}-shaped transformer: {billions:.2f}B parameters, {model.config.num_layers} "
          f"blocks, {tokens} tokens, built in {time.perf_counter() - started:.1f} s", flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.blocks)),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "model": args.model, "latent": list(shape), "tokens": tokens,
                "frames": args.frames, "size": [args.height, args.width], "causal_block": args.causal_block,
                "config": dict(model.config), "settings": records, "patch": common.patch_summary(report)}
    common.finish_model_bench(args, f"skyreels-v2-df-{args.model}", env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config = document["config"]
    causal = document["causal_block"]
    heading = (
        f"SkyReels-V2 {document['model']}-shaped transformer ({config['num_layers']} blocks, "
        f"{config['num_attention_heads']} heads of {config['attention_head_dim']}), one diffusion-forcing step of "
        f"{document['frames']} frames at {document['size'][0]}x{document['size'][1]} ({document['tokens']} tokens, "
        f"a timestep a latent frame{f', causal blocks of {causal} frames' if causal > 1 else ''}), bf16 with "
        f"diffusers' fp32 modules, {env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}; "
        "random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
