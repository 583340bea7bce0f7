"""An SDXL-shaped UNet end to end: diffusers' UNet2DConditionModel with Stable Diffusion XL's
configuration (channels 320/640/1280, 1/2/10 transformer layers per level, 2048-wide text
states, the text-and-time added conditioning), random weights, bf16, one denoising step of a
1024x1024 image (128x128 latents) at classifier-free guidance's batch of 2, 77 text tokens.
What kiln.patch takes there: each transformer block's three LayerNorms (kiln.layer_norm) and
its GEGLU feed-forward (one kiln.geglu of the packed projection); the GroupNorms, convolutions
and attention stay diffusers'. Four settings as bench/llama.py's: eager, eager + kiln,
torch.compile and torch.compile + kiln, compiled by region (each transformer block and ResNet
block in place, as diffusers' compile_repeated_blocks does: the whole UNet takes minutes).

Usage: python bench/sdxl_unet.py [--out DIR] [--quick] [--device cuda|cpu] [--tiny] [--tag TAG]
       [--settings eager,compile,eager+kiln,compile+kiln]
Writes DIR/sdxl-unet-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SDXL = dict(sample_size=128, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            block_out_channels=(320, 640, 1280), layers_per_block=2, cross_attention_dim=2048,
            transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816, norm_num_groups=32)
TINY = dict(SDXL, sample_size=16, block_out_channels=(32, 64, 64), transformer_layers_per_block=(1, 1, 1),
            attention_head_dim=(2, 4, 4), cross_attention_dim=32, addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=32 + 6 * 8, norm_num_groups=16)


def build_model(tiny=False, device="cuda", dtype=torch.bfloat16, seed=0):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = UNet2DConditionModel(**(TINY if tiny else SDXL))
    return model.to(dtype).eval()


def inputs(model, batch=2, text_tokens=77, device="cuda", dtype=torch.bfloat16, seed=1):
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    size = config.sample_size
    text_embeds = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    return dict(
        sample=torch.randn(batch, config.in_channels, size, size, device=device, dtype=dtype, generator=g),
        timestep=torch.tensor(500, device=device),
        encoder_hidden_states=torch.randn(batch, text_tokens, config.cross_attention_dim, device=device, dtype=dtype,
                                          generator=g),
        added_cond_kwargs={"text_embeds": torch.randn(batch, text_embeds, device=device, dtype=dtype, generator=g),
                           "time_ids": torch.tensor([[8 * size, 8 * size, 0, 0, 8 * size, 8 * size]] * batch,
                                                    device=device, dtype=dtype)})


def repeated_blocks(model):
    from diffusers.models.attention import BasicTransformerBlock
    from diffusers.models.resnet import ResnetBlock2D

    return [m for m in model.modules() if isinstance(m, (BasicTransformerBlock, ResnetBlock2D))]


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "sdxl_unet")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.tiny, args.device)
    kwargs = inputs(model, device=args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"SDXL-shaped UNet: {billions:.2f}B parameters, built in {time.perf_counter() - started:.1f} s", flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs).sample, kiln, settings=settings, reps=args.reps or (5 if args.quick else 20),
        compile_fn=common.compile_blocks(repeated_blocks(model)))
    document = {"environment": env, "config": dict(model.config), "dtype": "bf16", "batch": 2,
                "latent": [model.config.sample_size] * 2, "text_tokens": 77, "settings": records,
                "patch": common.patch_summary(report)}
    table = markdown(env, document)
    common.finish_model_bench(args, "sdxl-unet", env, document, table, started)
    return document


def markdown(env, document):
    versions = env["versions"]
    size = document["latent"][0]
    lines = [
        f"SDXL-shaped UNet, one step at {size}x{size} latents, batch 2, bf16, {env['device']} ({env['sm']}), "
        f"{env['date']}, torch {versions['torch']}; random weights. ms = median per forward, each call timed alone "
        "after at least 1 s of warm-up calls; host ms = median time the host takes to issue one; speedup of "
        "eager+kiln over eager and of compile+kiln over compile (compiled by region); errors of the output "
        "against the unpatched eager output; first call = the compile or kiln's JIT and tuning.",
        "",
    ] + common.settings_table(document)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
