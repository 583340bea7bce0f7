"""LTX-2 (diffusers' LTX2VideoTransformer3DModel: a video and an audio stream), bf16, random weights:
one denoising step of the transformer in the four settings of bench/llama.py (eager, eager +
kiln, torch.compile and torch.compile + kiln, compiled by block as diffusers'
compile_repeated_blocks does), as LTX2Pipeline calls it by default: 121 frames at 512x768 (16 x
16 x 24 = 6144 video latent tokens), 126 audio latents, 1024 text tokens, batch 2 (classifier-free
guidance's prompt and negative prompt in one call). LTX-2's checkpoints rotate each head's halves
(``rope_type="split"``); ``--rope interleaved`` takes diffusers' default instead. ``--model 2.3``
takes LTX-2.3's form: per-head attention gates, the text attention's query, keys and values
modulated, perturbed attention processors, text embeddings at the attentions' widths. What kiln takes:
each block's modulated norms and seams, a stream each (norm1's kiln.adaln; the residuals of the
self-attention, the text attention and the audio-video attention with the next norm's modulation,
each one kiln.gated_adaln; the audio-video norm's second modulation, kiln.adaln; the
feed-forward's gated residual, kiln.gated_residual_), the six attentions' q/k RMSNorms and
rotations (kiln.rope: q and k together in the self-attentions, each alone in the audio-video
ones), the feed-forwards' GELU (tanh) and the output LayerNorms. A fifth setting, "eager+kiln,
blocks apart", leaves the blocks and the attention processors to diffusers (their norms and GELUs
still kiln's): what those fusions give.

Usage: python bench/ltx2.py [--out DIR] [--quick] [--layers N] [--frames N] [--rope split|interleaved] [--model 2.3]
       [--settings ...] [--device cuda|cpu] [--tiny] [--tag TAG]
Writes DIR/ltx2[.3][-interleaved]-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BF16 = torch.bfloat16
# LTX-2's transformer: 48 blocks, video 4096 wide (32 heads of 128), audio 2048 wide (32 heads of
# 64), text embeddings of 3840 channels.
CONFIGS = {"2.0": dict(num_layers=48, rope_type="split"),
           "2.3": dict(num_layers=48, rope_type="split", gated_attn=True, cross_attn_mod=True, audio_gated_attn=True,
                       audio_cross_attn_mod=True, perturbed_attn=True, use_prompt_embeddings=False)}
TINY = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
            audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
            audio_cross_attention_dim=8, num_layers=2, caption_channels=16, rope_type="split")
TEXT_TOKENS = 1024


def build_model(layers=None, tiny=False, rope="split", device="cuda", seed=0, version="2.0"):
    """The model in bf16, its norms' weights (where it has any) given a random spread."""
    from diffusers import LTX2VideoTransformer3DModel

    config = dict(TINY, **{k: v for k, v in CONFIGS[version].items() if k != "num_layers"}) if tiny \
        else dict(CONFIGS[version])
    config["rope_type"] = rope
    if layers and not tiny:
        config["num_layers"] = layers
    torch.manual_seed(seed)
    with torch.device(device):
        model = LTX2VideoTransformer3DModel(**config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    return model.to(BF16).eval()


def inputs(model, frames, device="cuda", seed=1):
    """Latents of a 512x768 video of ``frames`` frames (VAE 8x in time, 32x in space) and of its
    audio (25 latents a second), the connectors' text embeddings and mask, a timestep."""
    config = model.config
    g = torch.Generator(device).manual_seed(seed)
    tiny = config.caption_channels == 16
    latent_frames, height, width = ((2, 3, 4) if tiny else ((frames - 1) // 8 + 1, 512 // 32, 768 // 32))
    audio_frames = 5 if tiny else round(frames / 24.0 * 16000 / 160 / 4)
    text = 8 if tiny else TEXT_TOKENS
    # Without a caption projection the connectors hand each stream's text at its attention's width.
    widths = (config.caption_channels,) * 2 if config.use_prompt_embeddings \
        else (config.cross_attention_dim, config.audio_cross_attention_dim)
    batch = 2
    r = lambda *shape: torch.randn(*shape, device=device, dtype=BF16, generator=g)  # noqa: E731
    t = torch.full((batch,), 500.0, device=device, dtype=BF16)
    kwargs = dict(hidden_states=r(batch, latent_frames * height * width, config.in_channels),
                  audio_hidden_states=r(batch, audio_frames, config.audio_in_channels),
                  encoder_hidden_states=r(batch, text, widths[0]),
                  audio_encoder_hidden_states=r(batch, text, widths[1]),
                  encoder_attention_mask=torch.ones(batch, text, dtype=torch.long, device=device),
                  audio_encoder_attention_mask=torch.ones(batch, text, dtype=torch.long, device=device),
                  timestep=t, sigma=t, num_frames=latent_frames, height=height, width=width, fps=24.0,
                  audio_num_frames=audio_frames, return_dict=False)
    return kwargs, latent_frames * height * width, audio_frames


def blocks_apart(kiln):
    """kiln.patch with the blocks and attention processors left to diffusers (their norms and
    GELUs patched as such)."""
    from kiln.patching import detect_ltx2

    return common.patch_leaving(kiln, detect_ltx2)


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--layers", type=int, default=8, help="blocks of the model (0: all 48)")
    parser.add_argument("--frames", type=int, default=121, help="video frames (8k + 1)")
    parser.add_argument("--rope", choices=("split", "interleaved"), default="split", help="the rotation's form")
    parser.add_argument("--model", choices=sorted(CONFIGS), default="2.0", help="LTX-2's version")
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "ltx2")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    model = build_model(args.layers, args.tiny, args.rope, args.device, version=args.model)
    kwargs, tokens, audio_tokens = inputs(model, args.frames, args.device)
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"LTX-{args.model}-shaped transformer: {billions:.2f}B parameters, {model.config.num_layers} blocks, {tokens} video "
          f"and {audio_tokens} audio tokens, {args.rope} rotation, built in {time.perf_counter() - started:.1f} s",
          flush=True)
    records, report = common.run_model_settings(
        model, lambda fn: fn(**kwargs)[0], kiln, settings=settings, reps=args.reps or (3 if args.quick else 10),
        compile_fn=common.compile_blocks(list(model.transformer_blocks)),
        variants={"eager+kiln, blocks apart": blocks_apart(kiln)} if "eager+kiln" in settings else None)
    document = {"environment": env, "dtype": "bf16", "model": args.model, "frames": args.frames, "rope": args.rope,
                "tokens": tokens,
                "audio_tokens": audio_tokens, "config": dict(model.config), "settings": records,
                "patch": common.patch_summary(report)}
    name = ("ltx2" if args.model == "2.0" else "ltx2.3") + ("" if args.rope == "split" else "-interleaved")
    common.finish_model_bench(args, name, env, document, markdown(env, document), started)
    return document


def markdown(env, document):
    config = document["config"]
    lines = [
        f"LTX-{document['model']}-shaped transformer ({config['num_layers']} blocks; video {config['num_attention_heads']} heads of "
        f"{config['attention_head_dim']}, audio {config['audio_num_attention_heads']} heads of "
        f"{config['audio_attention_head_dim']}; {document['rope']} rotation), one step of {document['frames']} frames "
        f"at 512x768 ({document['tokens']} video tokens, {document['audio_tokens']} audio tokens, {TEXT_TOKENS} text "
        f"tokens, batch 2), bf16, {env['device']} ({env['sm']}), {env['date']}, torch {env['versions']['torch']}; "
        "random weights. ms = median per forward, each call timed alone after at least 1 s of warm-up calls; host "
        "ms = median time the host takes to issue one; speedup of eager+kiln over eager and of compile+kiln over "
        f"compile (compiled by block); {common.ERRORS}; first call = the compile or kiln's JIT and tuning.",
        "",
    ] + common.settings_table(document)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
