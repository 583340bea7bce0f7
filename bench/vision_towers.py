"""Multimodal models' vision towers end to end: Qwen2.5-VL-7B's (RMSNorms, SwiGLU MLPs, window
attention), Qwen3-VL-8B's (LayerNorms, tanh-GELU MLPs, deepstack mergers), SigLIP-so400m's
(Gemma 3's, PaliGemma's, LLaVA-OneVision's: LayerNorms, tanh-GELU MLPs, no RoPE) and
MiniMax-M3-VL's (LayerNorms, erf-GELU MLPs, a 3-D RoPE over 78 of each head's 80 columns in
bf16), random weights, bf16, transformers' sdpa attention. The Qwen and MiniMax towers read one
1008x1008 (Qwen2.5-VL, MiniMax-M3-VL: 72 x 72 patches of 14) or 1024x1024 image (Qwen3-VL: 64 x
64 patches of 16); SigLIP a batch of 8 384x384 images (27 x 27 patches each). What kiln.patch takes there: the norms, the MLPs'
activations (one kiln.swiglu of gate and up; one kiln.gelu, or on CUDA without autograd the
first projection's GELU epilogue) and the attentions' RoPE (apply_rotary_pos_emb_vision as one
kiln.rope of the fp32 table). Four settings as bench/llama.py's: eager, eager + kiln,
torch.compile and torch.compile + kiln, compiled by region (each block in place).

Usage: python bench/vision_towers.py [--model qwen2.5-vl|qwen3-vl|siglip|minimax-m3-vl] [--out DIR] [--quick]
       [--device cuda|cpu] [--tiny] [--tag TAG] [--settings eager,compile,eager+kiln,compile+kiln]
Writes DIR/vision-tower-<model>-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# The towers' configurations (the released checkpoints' vision_config), and a tiny one of each.
TOWERS = {
    "qwen2.5-vl": dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                       patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                       fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu"),
    "qwen3-vl": dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                     patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                     deepstack_visual_indexes=[8, 16, 24], hidden_act="gelu_pytorch_tanh"),
    "siglip": dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                   image_size=384, patch_size=14, hidden_act="gelu_pytorch_tanh"),
    "minimax-m3-vl": dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                          patch_size=14, temporal_patch_size=2, spatial_merge_size=2, hidden_act="gelu"),
}
TINY = {
    "qwen2.5-vl": dict(TOWERS["qwen2.5-vl"], depth=2, hidden_size=64, intermediate_size=96, num_heads=2,
                       out_hidden_size=64, window_size=56, fullatt_block_indexes=[1]),
    "qwen3-vl": dict(TOWERS["qwen3-vl"], depth=2, hidden_size=64, intermediate_size=96, num_heads=2,
                     out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=[1]),
    "siglip": dict(TOWERS["siglip"], hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=2, image_size=56),
    "minimax-m3-vl": dict(TOWERS["minimax-m3-vl"], hidden_size=160, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=2),
}
# The Qwen towers' image as a [frames, height, width] patch grid; SigLIP's batch of images.
GRIDS = {"qwen2.5-vl": [1, 72, 72], "qwen3-vl": [1, 64, 64], "minimax-m3-vl": [1, 72, 72]}
TINY_GRIDS = {"qwen2.5-vl": [1, 8, 8], "qwen3-vl": [1, 8, 8], "minimax-m3-vl": [1, 8, 8]}
SIGLIP_IMAGES = 8


# The Qwen towers' modules: (transformers' model folder, the multimodal config class, the tower class).
QWEN_CLASSES = {"qwen2.5-vl": ("qwen2_5_vl", "Qwen2_5_VLConfig", "Qwen2_5_VisionTransformerPretrainedModel"),
                "qwen3-vl": ("qwen3_vl", "Qwen3VLConfig", "Qwen3VLVisionModel")}


def build(name, tiny=False, device="cuda", dtype=torch.bfloat16, seed=0):
    """(the tower, its blocks) with random weights, sdpa attention, in eval mode."""
    import importlib

    import transformers

    config = (TINY if tiny else TOWERS)[name]
    torch.manual_seed(seed)
    if name in QWEN_CLASSES:
        folder, config_class, tower_class = QWEN_CLASSES[name]
        vision = getattr(transformers, config_class)(vision_config=config).vision_config
        modeling = importlib.import_module(f"transformers.models.{folder}.modeling_{folder}")
    elif name == "minimax-m3-vl":
        folder = "transformers.models.minimax_m3_vl"
        vision = importlib.import_module(f"{folder}.configuration_minimax_m3_vl").MiniMaxM3VLVisionConfig(**config)
        modeling, tower_class = importlib.import_module(f"{folder}.modeling_minimax_m3_vl"), "MiniMaxM3VLVisionModel"
    else:
        vision, modeling, tower_class = transformers.SiglipVisionConfig(**config), transformers, "SiglipVisionModel"
    vision._attn_implementation = "sdpa"
    with torch.device(device):
        tower = getattr(modeling, tower_class)(vision)
    blocks = list(tower.blocks) if name in QWEN_CLASSES else list(
        tower.layers if name == "minimax-m3-vl" else tower.encoder.layers)
    return tower.to(dtype).eval(), blocks


def inputs(name, tower, tiny=False, device="cuda", dtype=torch.bfloat16, seed=1):
    """The tower's keyword arguments for one forward."""
    config = tower.config
    g = torch.Generator(device).manual_seed(seed)
    if name == "siglip":
        size = config.image_size
        return {"pixel_values": torch.randn(SIGLIP_IMAGES, 3, size, size, device=device, dtype=dtype, generator=g)}
    grid = (TINY_GRIDS if tiny else GRIDS)[name]
    channels = config.num_channels if name == "minimax-m3-vl" else config.in_channels
    width = channels * config.temporal_patch_size * config.patch_size ** 2
    patches = grid[0] * grid[1] * grid[2]
    values = torch.randn(patches, width, device=device, dtype=dtype, generator=g)
    return {"pixel_values" if name == "minimax-m3-vl" else "hidden_states": values,
            "grid_thw": torch.tensor([grid], device=device)}


def output(name, result):
    """What the tower hands on, for the error columns: the merged patch features (pooler_output),
    or MiniMax-M3-VL's patch features (its pooler_output is one vector an image)."""
    return result.last_hidden_state if name == "minimax-m3-vl" else result.pooler_output


def main(argv=None):
    parser = argparse.ArgumentParser()
    common.add_module_bench_arguments(parser)
    parser.add_argument("--model", default="qwen3-vl", choices=sorted(TOWERS))
    args = parser.parse_args(argv)
    settings = common.model_settings(args.settings, "vision_towers")
    kiln = common.fresh_kiln(1024)
    env = common.model_environment(args.device)
    started = time.perf_counter()
    tower, blocks = build(args.model, args.tiny, args.device)
    kwargs = inputs(args.model, tower, args.tiny, args.device)
    millions = sum(p.numel() for p in tower.parameters()) / 1e6
    print(f"{args.model} tower: {millions:.0f}M parameters, built in {time.perf_counter() - started:.1f} s", flush=True)
    records, report = common.run_model_settings(
        tower, lambda fn: output(args.model, fn(**kwargs)), kiln, settings=settings,
        reps=args.reps or (5 if args.quick else 20), compile_fn=common.compile_blocks(blocks), kernel_times=True)
    document = {"environment": env, "model": args.model, "config": (TINY if args.tiny else TOWERS)[args.model],
                "dtype": "bf16", "inputs": {k: list(v.shape) for k, v in kwargs.items()},
                "grid_thw": kwargs["grid_thw"].tolist() if "grid_thw" in kwargs else None,
                "settings": records, "patch": common.patch_summary(report)}
    table = markdown(env, document)
    common.finish_model_bench(args, f"vision-tower-{args.model}", env, document, table, started)
    return document


def markdown(env, document):
    versions = env["versions"]
    shown = f"grid {document['grid_thw']}" if document["grid_thw"] else f"pixel_values {document['inputs']['pixel_values']}"
    lines = [
        f"{document['model']} vision tower, {shown}, bf16, sdpa attention, {env['device']} ({env['sm']}), "
        f"{env['date']}, torch {versions['torch']}, transformers {versions.get('transformers', '-')}; random weights. "
        "ms = median per forward, each call timed alone after at least 1 s of warm-up calls; host ms = median time "
        "the host takes to issue one (the Qwen towers' attention reads its sequence lengths back to the host in "
        "every block, so the GPU waits on the host and ms follows the host); kernel ms = the forward's kernels' GPU time "
        "(torch.profiler, 5 forwards), kernels vs base = the base setting's over this one's; speedup of eager+kiln over eager and of compile+kiln over compile (compiled "
        "by block); errors of the tower's output (the merged features; MiniMax-M3-VL's patch features) against the unpatched eager output; first call = the compile or "
        "kiln's JIT and tuning.",
        "",
    ] + common.settings_table(document)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
