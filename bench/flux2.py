"""FLUX.2 (diffusers' Flux2Transformer2DModel), bf16, random weights, one denoising step: 512 text
tokens and a 1024x1024 image (64 x 64 = 4096 packed latent tokens) unless told otherwise, in the
four settings of bench/llama.py (eager, eager + kiln, torch.compile and torch.compile + kiln,
compiled by block as diffusers' compile_repeated_blocks does), at FLUX.2-dev's widths (48 heads
of 128, 6144 wide) with 2 of its 8 double-stream and 8 of its 48 single-stream blocks unless told
otherwise.

What kiln.patch replaces there: the double blocks' modulated norms and seams (kiln.adaln,
kiln.gated_adaln, kiln.gated_residual_, from the model's shared modulation), the single blocks'
(kiln.adaln, kiln.gated_residual), each attention's per-head q/k RMSNorms and rotation
(head_norm_rope), the feed-forwards' SwiGLU (Flux2SwiGLU: one kiln.swiglu of the packed
projection; in the single blocks written into to_out's input) and the output AdaLN. A fifth
setting, "eager+kiln, blocks apart", leaves the blocks and the single blocks' parallel attention
to diffusers: what those fusions give.

Usage: python bench/flux2.py [--out DIR] [--quick] [--layers N] [--single-layers N] [--height H]
       [--width W] [--settings ...] [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/flux2-dev-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
TEXT_TOKENS = 512  # Flux2Pipeline's max_sequence_length
GUIDANCE = 4.0  # Flux2Pipeline's default guidance_scale, embedded by the guidance-distilled dev model
FULL = dict(patch_size=1, in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
            num_attention_heads=48, joint_attention_dim=15360, timestep_guidance_channels=256,
            axes_dims_rope=(32, 32, 32, 32))
TINY = dict(patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=24, timestep_guidance_channels=16, axes_dims_rope=(4, 4, 4, 4))
TINY_TEXT_TOKENS = 5


def build_model(layers=2, single_layers=8, tiny=False, device="cuda", seed=0):
    """The transformer in bf16, built in bf16 (a 32B model's fp32 copy would not be made first),
    its q/k norms' weights given a random spread (they start at 1)."""
    config = dict(TINY) if tiny else dict(FULL, num_layers=layers or FULL["num_layers"],
                                          num_single_layers=FULL["num_single_layers"] if single_layers is None
                                          else single_layers)
    return common.bf16_diffusers_model("Flux2Transformer2DModel", config, device, seed)


def build_inputs(config, height, width, device="cuda", tiny=False, seed=1):
    """The transformer's keyword arguments at one step (t = 0.5), batch 1: packed latents of a
    height x width image (the VAE's 16x, 2x2 patches packed), ids (t, row, column, layer) a token,
    the text's (0, 0, 0, position)."""
    rows, cols = (3, 4) if tiny else (height // 16, width // 16)
    text = TINY_TEXT_TOKENS if tiny else TEXT_TOKENS
    g = torch.Generator("cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=BF16)

    grid = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(rows * 1.0), torch.arange(cols * 1.0),
                                      torch.zeros(1), indexing="ij"), -1).reshape(rows * cols, 4)
    text_ids = torch.stack([torch.zeros(text)] * 3 + [torch.arange(text * 1.0)], -1)
    return dict(hidden_states=randn(1, rows * cols, config["in_channels"]),
                encoder_hidden_states=randn(1, text, config["joint_attention_dim"]),
                timestep=torch.full((1,), 0.5, device=device, dtype=BF16),
                guidance=torch.full((1,), GUIDANCE, device=device, dtype=torch.float32),
                img_ids=grid.to(device), txt_ids=text_ids.to(device), return_dict=False)


def blocks_apart(kiln):
    """kiln.patch with FLUX.2's blocks and parallel attention left to diffusers (the joint
    attention, norms, SwiGLU and output AdaLN still kiln's)."""
    from kiln.patching import detect_flux2

    return common.patch_leaving(kiln, detect_flux2)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=2, help="double-stream blocks (0: all 8)")
    parser.add_argument("--single-layers", type=int, default=8, help="single-stream blocks (FLUX.2-dev has 48)")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "flux2")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.layers, args.single_layers, args.tiny, args.device)
    config = dict(model.config)
    kwargs = build_inputs(config, args.height, args.width, args.device, args.tiny)
    tokens = kwargs["hidden_states"].shape[1]
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"FLUX.2-dev-shaped transformer: {billions:.2f}B parameters, {config['num_layers']} double and "
          f"{config['num_single_layers']} single blocks, {tokens} image + {kwargs['txt_ids'].shape[0]} text tokens, "
          f"built in {time.perf_counter() - started:.1f} s", flush=True)
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(blocks),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "image": [args.height, args.width], "image_tokens": tokens,
                "text_tokens": kwargs["txt_ids"].shape[0], "parameters_billions": billions, "config": config,
                "settings": records, "patch": common.patch_summary(report)}
    common.finish_model_bench(args, "flux2-dev", env, document, markdown(env, document, args), started)
    return document


def markdown(env, document, args):
    versions = env["versions"]
    config = document["config"]
    lines = [
        f"FLUX.2-dev-shaped transformer ({config['num_layers']} double-stream and {config['num_single_layers']} "
        f"single-stream blocks, {config['num_attention_heads']} heads of {config['attention_head_dim']}, "
        f"{document['parameters_billions']:.1f}B parameters), one step at {args.height}x{args.width} "
        f"({document['image_tokens']} image + {document['text_tokens']} text tokens, batch 1), bf16, "
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
