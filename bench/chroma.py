"""Chroma (diffusers' ChromaTransformer2DModel: Chroma1-HD's widths), bf16, random weights: one
transformer call as ChromaPipeline makes it (batch 1; with guidance it calls the transformer again
for the negative prompt): a 1024x1024 image (64 x 64 = 4096 packed latent tokens) and 512 prompt
tokens, the padding masked as the pipeline masks it (a prompt of 128 tokens, one padding token
kept). Four settings of bench/llama.py (eager, eager + kiln, torch.compile and torch.compile + kiln,
compiled by block as diffusers' compile_repeated_blocks does). What kiln takes: the pruned AdaLN
modules (kiln.adaln), the double blocks' seams (kiln.gated_adaln, kiln.gated_residual_), the single
blocks' GELU and gated residual, the per-head q/k RMSNorms with the rotation, the feed-forwards'
GELU, the approximator's RMSNorms. A fifth setting, "eager+kiln, blocks apart", leaves the blocks
to diffusers (their AdaLN modules, norms and GELUs still kiln's): what the seams give.

Usage: python bench/chroma.py [--out DIR] [--quick] [--layers N] [--single-layers N] [--settings ...]
       [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/chroma-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from flux import image_ids, latent_tokens  # noqa: E402

BF16 = torch.bfloat16
FULL = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=4096, axes_dims_rope=(16, 56, 56), approximator_num_channels=64,
            approximator_hidden_dim=5120, approximator_layers=5)
TINY = dict(patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=(4, 6, 6), approximator_num_channels=8,
            approximator_hidden_dim=32, approximator_layers=1)
SIZE, TEXT_TOKENS, PROMPT = 1024, 512, 128  # ChromaPipeline's max_sequence_length; the prompt's own tokens


def build_model(layers=None, single_layers=None, tiny=False, device="cuda", seed=0):
    """The transformer in bf16 (built in bf16: an 8.9B model's fp32 copy would take 36 GB first),
    its norms' weights (where they have any) given a random spread."""
    config = dict(TINY if tiny else FULL)
    if not tiny:
        config["num_layers"] = layers or config["num_layers"]
        config["num_single_layers"] = config["num_single_layers"] if single_layers is None else single_layers
    return common.bf16_diffusers_model("ChromaTransformer2DModel", config, device, seed)


def build_inputs(config, device="cuda", tiny=False, seed=1):
    """The transformer's keyword arguments as ChromaPipeline passes them at one step (t = 500 of
    1000; the text ids all zero; the mask: the prompt's tokens and one padding token, then every
    image token)."""
    rows, cols = (3, 4) if tiny else latent_tokens(SIZE, SIZE)
    text, prompt = (5, 3) if tiny else (TEXT_TOKENS, PROMPT)
    g = torch.Generator("cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=BF16)

    mask = torch.ones(1, text + rows * cols, dtype=torch.bool, device=device)
    mask[:, prompt + 1:text] = False
    return dict(hidden_states=randn(1, rows * cols, config["in_channels"]),
                encoder_hidden_states=randn(1, text, config["joint_attention_dim"]),
                timestep=torch.full((1,), 0.5, device=device, dtype=BF16), img_ids=image_ids(rows, cols, device),
                txt_ids=torch.zeros(text, 3, device=device, dtype=BF16), attention_mask=mask, return_dict=False)


def blocks_apart(kiln):
    """kiln.patch with Chroma's blocks left to diffusers (their pruned AdaLNs, norms and GELUs patched)."""
    from kiln.patching import detect_chroma

    return common.patch_leaving(kiln, detect_chroma,
                                leave=(detect_chroma.classify_double_block, detect_chroma.classify_single_block))


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=4, help="double-stream blocks (0: all 19)")
    parser.add_argument("--single-layers", type=int, default=8, help="single-stream blocks (default 8 of 38)")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "chroma")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.layers, args.single_layers, args.tiny, args.device)
    config = dict(model.config)
    kwargs = build_inputs(config, args.device, args.tiny)
    tokens = kwargs["hidden_states"].shape[1]
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"Chroma-shaped transformer: {billions:.2f}B parameters, {config['num_layers']} double and "
          f"{config['num_single_layers']} single blocks, {tokens} image + {kwargs['txt_ids'].shape[0]} text tokens, "
          f"built in {time.perf_counter() - started:.1f} s", flush=True)
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(blocks),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "image_tokens": tokens, "text_tokens": kwargs["txt_ids"].shape[0],
                "parameters_billions": billions, "config": config, "settings": records,
                "patch": common.patch_summary(report)}
    common.finish_model_bench(args, "chroma", env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config = document["config"]
    heading = (
        f"Chroma-shaped transformer ({config['num_layers']} double-stream and {config['num_single_layers']} "
        f"single-stream blocks, {config['num_attention_heads']} heads of {config['attention_head_dim']}, "
        f"{document['parameters_billions']:.1f}B parameters), one call at {SIZE}x{SIZE} ({document['image_tokens']} "
        f"image + {document['text_tokens']} text tokens, {PROMPT} of them the prompt's), batch 1, bf16, "
        f"{env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}; random weights.")
    return common.blockwise_markdown(heading, document)


if __name__ == "__main__":
    main()
