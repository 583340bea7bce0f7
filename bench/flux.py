"""FLUX.1 (diffusers' FluxTransformer2DModel), bf16, random weights, one denoising step as
FluxPipeline calls its transformer: 512 text tokens and a 1024x1024 image (64 x 64 = 4096 packed
latent tokens) unless told otherwise; or, with ``--model ovis-image``, Ovis-Image-7B's transformer
(diffusers' OvisImageTransformer2DModel: FLUX's blocks, 6 double-stream and 27 single-stream, its
single blocks' MLP a SwiGLU, 256 text tokens as OvisImagePipeline passes them); in the four
settings of bench/llama.py (eager, eager + kiln, torch.compile and torch.compile + kiln, compiled
by block as diffusers' compile_repeated_blocks does: the double-stream and the single-stream
blocks share two graphs).

What kiln.patch replaces there: the AdaLN modules (norm plus modulation), each attention's
per-head q/k RMSNorms and rotation (``head_norm_rope`` without autograd), the double blocks'
LayerNorms and the feed-forwards' tanh GELU. The rest of a step is matmuls and attention.

With ``--fp8-storage`` the projections are stored in fp8 and computed in bf16, as diffusers'
``enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)``
keeps them (half the weights' memory; each Linear upcasts its weight in a hook around its call):
kiln.patch then goes beneath the hooks, which still cast.

Usage: python bench/flux.py [--out DIR] [--quick] [--model dev|schnell|ovis-image] [--layers N]
       [--single-layers N] [--height H] [--width W] [--fp8-storage] [--settings ...]
       [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/flux-<model>[-fp8-storage]-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
TEXT_TOKENS = 512  # FluxPipeline's max_sequence_length for FLUX.1-dev
GUIDANCE = 3.5  # FluxPipeline's default guidance_scale, embedded by the guidance-distilled dev model
# FLUX.1-dev and -schnell share the transformer's widths; dev embeds the guidance scale too.
# Ovis-Image-7B's transformer has FLUX's widths and fewer blocks; its text tokens are
# OvisImagePipeline's max_sequence_length. name: (diffusers class, config, text tokens)
FLUX_CONFIG = dict(num_layers=19, num_single_layers=38, joint_attention_dim=4096, pooled_projection_dim=768)
MODELS = {"dev": ("FluxTransformer2DModel", dict(FLUX_CONFIG, guidance_embeds=True), TEXT_TOKENS),
          "schnell": ("FluxTransformer2DModel", dict(FLUX_CONFIG, guidance_embeds=False), TEXT_TOKENS),
          "ovis-image": ("OvisImageTransformer2DModel",
                         dict(num_layers=6, num_single_layers=27, joint_attention_dim=2048, out_channels=64), 256)}
TITLES = {"dev": "FLUX.1-dev", "schnell": "FLUX.1-schnell", "ovis-image": "Ovis-Image-7B"}
WIDTHS = dict(patch_size=1, in_channels=64, attention_head_dim=128, num_attention_heads=24, axes_dims_rope=(16, 56, 56))
TINY = dict(patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=(4, 6, 6))
TINY_OWN = dict(pooled_projection_dim=12, out_channels=8)  # where a model's config has them
TINY_TEXT_TOKENS = 5


def model_config(name, layers=None, single_layers=None, tiny=False):
    config = dict(WIDTHS, **MODELS[name][1])
    if tiny:
        config.update(TINY, **{k: v for k, v in TINY_OWN.items() if k in config})
    if layers and not tiny:
        config["num_layers"] = layers
    if single_layers is not None and not tiny:
        config["num_single_layers"] = single_layers
    return config


def build_model(name="dev", layers=None, single_layers=None, tiny=False, device="cuda", seed=0):
    """The transformer in bf16, as FluxPipeline.from_pretrained(torch_dtype=torch.bfloat16) holds
    it (the model keeps no module in fp32; its rotary angles are computed in each forward)."""
    import diffusers

    torch.manual_seed(seed)
    # Built in bf16 rather than cast after: a 12B model's fp32 copy would take 48 GB first.
    default = torch.get_default_dtype()
    torch.set_default_dtype(BF16)
    try:
        with torch.device(device):
            model = getattr(diffusers, MODELS[name][0])(**model_config(name, layers, single_layers, tiny))
    finally:
        torch.set_default_dtype(default)
    assert all(p.dtype == BF16 for p in model.parameters())
    return model.eval()


def latent_tokens(height, width):
    """The packed latent grid of a height x width image: the VAE's 8x downsampling, then 2x2
    patches packed into one token (FluxPipeline._pack_latents)."""
    return height // 16, width // 16


def image_ids(rows, cols, device):
    """FluxPipeline._prepare_latent_image_ids: (0, row, column) a token."""
    ids = torch.zeros(rows, cols, 3)
    ids[..., 1] += torch.arange(rows)[:, None]
    ids[..., 2] += torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3).to(device=device, dtype=BF16)


def build_inputs(config, height, width, device="cuda", tiny=False, batch=1, seed=1, text_tokens=TEXT_TOKENS):
    """The transformer's keyword arguments as FluxPipeline passes them at one step (t = 500 of
    1000; the text ids all zero): the pooled text and the guidance where the model takes them."""
    rows, cols = (3, 4) if tiny else latent_tokens(height, width)
    text = TINY_TEXT_TOKENS if tiny else text_tokens
    g = torch.Generator("cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=BF16)

    kwargs = dict(hidden_states=randn(batch, rows * cols, config["in_channels"]),
                  encoder_hidden_states=randn(batch, text, config["joint_attention_dim"]),
                  timestep=torch.full((batch,), 0.5, device=device, dtype=BF16),
                  img_ids=image_ids(rows, cols, device), txt_ids=torch.zeros(text, 3, device=device, dtype=BF16),
                  return_dict=False)
    if config.get("pooled_projection_dim"):
        kwargs["pooled_projections"] = randn(batch, config["pooled_projection_dim"])
    if config.get("guidance_embeds"):
        kwargs["guidance"] = torch.full((batch,), GUIDANCE, device=device, dtype=torch.float32)
    return kwargs


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--model", choices=sorted(MODELS), default="dev")
    parser.add_argument("--layers", type=int, default=0, help="double-stream blocks (default: all)")
    parser.add_argument("--single-layers", type=int, default=None, help="single-stream blocks (default: all)")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--fp8-storage", action="store_true",
                        help="projections stored in fp8, computed in bf16 (diffusers' layerwise casting)")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "flux")
    layers, single_layers = args.layers, args.single_layers
    if args.quick and not layers and single_layers is None:
        layers, single_layers = 2, 4
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.model, layers, single_layers, args.tiny, args.device)
    if args.fp8_storage:
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=BF16)
    config = dict(model.config)
    kwargs = build_inputs(config, args.height, args.width, args.device, args.tiny, text_tokens=MODELS[args.model][2])
    tokens = kwargs["hidden_states"].shape[1]
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"{TITLES[args.model]}-shaped transformer: {billions:.2f}B parameters, {config['num_layers']} double and "
          f"{config['num_single_layers']} single blocks, {tokens} image + {kwargs['txt_ids'].shape[0]} text tokens, "
          f"built in {time.perf_counter() - started:.1f} s", flush=True)
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(blocks))
    document = {"environment": env, "dtype": "bf16", "image": [args.height, args.width], "image_tokens": tokens,
                "text_tokens": kwargs["txt_ids"].shape[0], "parameters_billions": billions, "config": config,
                "settings": records, "patch": common.patch_summary(report),
                "weight_storage": "float8_e4m3fn (layerwise casting)" if args.fp8_storage else "bf16"}
    table = markdown(env, document, args)
    name = f"flux-{args.model}" + ("-fp8-storage" if args.fp8_storage else "")
    common.finish_model_bench(args, name, env, document, table, started)
    return document


def markdown(env, document, args):
    versions = env["versions"]
    config = document["config"]
    lines = [
        f"{TITLES[args.model]}-shaped transformer ({config['num_layers']} double-stream and "
        f"{config['num_single_layers']} single-stream blocks, {config['num_attention_heads']} heads of "
        f"{config['attention_head_dim']}, {document['parameters_billions']:.1f}B parameters), one step at "
        f"{args.height}x{args.width} ({document['image_tokens']} image + {document['text_tokens']} text tokens), bf16"
        f"{' (projections stored in fp8: layerwise casting)' if args.fp8_storage else ''}, "
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
