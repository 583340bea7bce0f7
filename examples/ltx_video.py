"""kiln on LTX-Video's transformer: patch it, run one denoising forward, and compare with the
unpatched model.

    python examples/ltx_video.py /path/to/LTX-Video      # a local diffusers checkpoint (the
                                                         # pipeline's folder or its transformer/)
    python examples/ltx_video.py                         # random weights, the default config
    python examples/ltx_video.py --tiny                  # random weights, a tiny config

The inputs are what diffusers' LTXPipeline gives the transformer in its denoising loop:
packed latents of a video (the VAE compresses 8x in time and 32x in space), prompt
embeddings with their mask (random here: no text encoder is loaded), a timestep, the
latent's size and the rope scale. Runs on the GPU where there is one (bf16), else on the
CPU (fp32, kiln's CPU implementations; without a checkpoint the CPU run uses 2 blocks).
Prints kiln.patch's report and how far the patched output is from the unpatched one.
"""

import argparse
import os
import sys
import time

import torch
from diffusers import LTXVideoTransformer3DModel

import kiln

TINY = dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
            num_layers=2, caption_channels=24)


def load(args, device, dtype):
    if args.checkpoint:
        if not os.path.isdir(args.checkpoint):
            raise SystemExit(f"ltx_video example: checkpoint: expected a local directory, got {args.checkpoint!r}")
        sub = "transformer" if os.path.isdir(os.path.join(args.checkpoint, "transformer")) else None
        model = LTXVideoTransformer3DModel.from_pretrained(args.checkpoint, subfolder=sub, torch_dtype=dtype,
                                                           local_files_only=True)
        return model.to(device).eval()
    config = dict(TINY) if args.tiny else {}
    if args.layers is not None:
        config["num_layers"] = args.layers
    elif device == "cpu" and not args.tiny:
        config["num_layers"] = 2  # the 28 blocks of the default config take minutes on a CPU
    torch.manual_seed(0)
    with torch.device(device):
        model = LTXVideoTransformer3DModel(**config)
        with torch.no_grad():  # norm weights start at one: give them a spread so they matter
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


def pipeline_inputs(config, frames, height, width, device, dtype, batch=2, text_tokens=128):
    latent_frames, latent_height, latent_width = (frames - 1) // 8 + 1, height // 32, width // 32
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(batch, text_tokens, dtype=torch.long)
    mask[1:, text_tokens // 3:] = 0  # the second prompt shorter, padded
    return dict(
        hidden_states=torch.randn(batch, latent_frames * latent_height * latent_width, config.in_channels,
                                  generator=g).to(device, dtype),
        encoder_hidden_states=torch.randn(batch, text_tokens, config.caption_channels, generator=g).to(device, dtype),
        timestep=torch.full((batch,), 600.0, device=device),
        encoder_attention_mask=mask.to(device),
        num_frames=latent_frames, height=latent_height, width=latent_width,
        rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False)


def forward(model, inputs):
    start = time.perf_counter()
    with torch.no_grad():
        out = model(**inputs)[0]
    if out.is_cuda:
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", nargs="?", help="a local diffusers LTX-Video checkpoint directory")
    parser.add_argument("--tiny", action="store_true", help="random weights, a tiny config (no checkpoint)")
    parser.add_argument("--layers", type=int, default=None, help="blocks of the random model")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--frames", type=int, default=None, help="video frames (GPU default 49, CPU 9)")
    parser.add_argument("--height", type=int, default=None, help="video height (GPU default 512, CPU 128)")
    parser.add_argument("--width", type=int, default=None, help="video width (GPU default 768, CPU 192)")
    args = parser.parse_args()
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gpu = device == "cuda"
    frames = args.frames or (49 if gpu else 9)
    height = args.height or (512 if gpu else 128)
    width = args.width or (768 if gpu else 192)

    model = load(args, device, dtype)
    config = model.config
    inputs = pipeline_inputs(config, frames, height, width, device, dtype)
    print(f"model: {type(model).__name__}, {config.num_layers} blocks, {config.num_attention_heads} heads x "
          f"{config.attention_head_dim}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{dtype} on {device}; video {frames}x{height}x{width} = {inputs['hidden_states'].shape[1]} latent tokens")

    forward(model, inputs)  # both timings are of a second call
    reference, ref_s = forward(model, inputs)
    report = kiln.patch(model)
    print(report)
    forward(model, inputs)  # the first call compiles and tunes kiln's kernels for these shapes
    out, kiln_s = forward(model, inputs)
    restored = kiln.unpatch(model)

    diff = (out.double() - reference.double()).abs()
    max_rel = (diff.max() / reference.double().abs().max()).item()
    mean_rel = (diff.mean() / reference.double().abs().mean()).item()
    print(f"unpatched forward: {ref_s:.3f} s; kiln forward: {kiln_s:.3f} s")
    print(f"comparison: output {tuple(out.shape)}, max rel err {max_rel:.2e}, mean rel err {mean_rel:.2e} "
          "(max|d| / max|ref|, mean|d| / mean|ref|)")
    print(f"kiln.unpatch: {restored} modules restored")
    return 0 if torch.isfinite(out).all() else 1


if __name__ == "__main__":
    sys.exit(main())
