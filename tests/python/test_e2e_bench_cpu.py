"""The CPU side of the end-to-end benchmarks (bench/ltx_video.py, bench/llama.py): the models
and inputs they build (the full-size ones on the meta device, the tiny ones for real), the
decode step's static-cache set-up against a plain forward, the settings runner, and a smoke
run of each script on the CPU. Timings are not checked here; the GPU run measures them."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import kiln
from bench_scripts import BENCH, load_bench

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _smoke(script, out, *extra, settings="eager,eager+kiln"):
    cmd = [sys.executable, os.path.join(BENCH, script), "--device", "cpu", "--tiny", "--reps", "1",
           *(["--settings", settings] if settings else []), "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_model_time_warms_up_for_calls_and_for_seconds():
    import time

    common = load_bench("common")
    calls = []  # (start, end) of each call

    def sleep(seconds):
        def call():
            begin = time.perf_counter()
            time.sleep(seconds)
            calls.append((begin, time.perf_counter()))
        return call

    # Warm-up calls run until 50 ms have passed, well over the 3 counted, and stop then; how many
    # that takes depends on how late a loaded host wakes a 1 ms sleep, so the check is on times.
    common.model_times(sleep(0.001), warmup=3, reps=2, warmup_s=0.05)
    warmup = calls[:-2]
    assert len(warmup) >= 3
    assert warmup[-1][1] - warmup[0][0] >= 0.05 - 1e-3  # none stopped it early
    if len(warmup) > 3:
        assert warmup[-2][1] - warmup[0][0] < 0.05  # nor ran on past the 50 ms
    calls.clear()
    ms = common.model_times(sleep(0.02), warmup=3, reps=2, warmup_s=0.0)["ms"]
    assert len(calls) == 3 + 2 and ms >= 20  # the counted calls where the seconds are shorter


# ---- LTX-Video ------------------------------------------------------------------------

diffusers_missing = importlib.util.find_spec("diffusers") is None
needs_diffusers = pytest.mark.skipif(diffusers_missing, reason="diffusers is not installed")


def test_ltx_latent_sizes():
    ltx = load_bench("ltx_video")
    assert ltx.latent_size(49) == (7, 16, 24)  # 2688 tokens per sample
    assert ltx.latent_size(161) == (21, 16, 24)
    assert ltx.latent_size(9, 64, 96) == (2, 2, 3)


@needs_diffusers
def test_ltx_default_model_and_inputs():
    """The benchmark's model is the constructor's default (the 2B config); built on the meta
    device, so nothing is allocated. Its inputs are built for real."""
    ltx = load_bench("ltx_video")
    model = ltx.build_model(device="meta")
    config = model.config
    assert (config.num_layers, config.num_attention_heads, config.attention_head_dim) == (28, 32, 64)
    assert (config.in_channels, config.caption_channels, config.cross_attention_dim) == (128, 4096, 2048)
    assert 1.8e9 < sum(p.numel() for p in model.parameters()) < 2.1e9
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    inputs = ltx.build_inputs(config, 49, device="cpu")
    assert inputs["hidden_states"].shape == (2, 7 * 16 * 24, 128)
    assert inputs["hidden_states"].dtype == torch.bfloat16
    assert inputs["encoder_hidden_states"].shape == (2, 128, 4096)
    assert inputs["encoder_attention_mask"].shape == (2, 128)
    assert inputs["encoder_attention_mask"][0].all() and not inputs["encoder_attention_mask"][1].all()
    assert (inputs["num_frames"], inputs["height"], inputs["width"]) == (7, 16, 24)
    assert inputs["rope_interpolation_scale"] == (8 / 25, 32, 32)
    assert ltx.build_model(layers=3, device="meta").config.num_layers == 3


@needs_diffusers
def test_ltx_tiny_forward_patched_and_unpatched():
    ltx, common = load_bench("ltx_video"), load_bench("common")
    model = ltx.build_model(tiny=True, device="cpu")
    inputs = ltx.build_inputs(model.config, 17, 64, 96, device="cpu")
    logs = []
    records, report = common.run_model_settings(model, lambda fn: ltx.forward(fn, inputs), kiln,
                                                settings=("eager", "eager+kiln"), warmup=0, reps=1,
                                                log=logs.append)
    tokens = 3 * 2 * 3
    assert records["eager"]["output_shape"] == [2, tokens, 8]
    assert records["eager+kiln"]["output_shape"] == [2, tokens, 8]
    assert "error_vs_eager" not in records["eager"]
    err = records["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 2e-2 and err["mean_rel"] < 2e-2
    assert records["eager+kiln"]["speedup_vs"] == "eager" and records["eager+kiln"]["speedup"] > 0
    summary = common.patch_summary(report)
    assert summary["left"] == 0
    # Every norm, GELU and attention of the 2 blocks, and the blocks' AdaLN seams.
    assert summary["replaced"]["gelu"] == 2 and summary["replaced"]["layer_norm"] == 1
    assert summary["replaced"]["rms_norm"] >= 2
    assert any(kind.startswith("rms_norm_rope") for kind in summary["replaced"])
    assert any(kind.startswith("adaln") for kind in summary["replaced"])
    assert len(logs) == 2
    # run_model_settings leaves the model unpatched.
    assert all("forward" not in m.__dict__ for m in model.modules())


@needs_diffusers
def test_ltx_compile_blocks_in_place_and_undone():
    ltx, common = load_bench("ltx_video"), load_bench("common")
    model = ltx.build_model(tiny=True, device="cpu")
    compiled, undo = common.compile_blocks(model.transformer_blocks)(model)
    assert compiled is model  # the same module tree, so kiln.patch sees the same modules
    assert all(b._compiled_call_impl is not None for b in model.transformer_blocks)
    undo()
    assert all(b._compiled_call_impl is None for b in model.transformer_blocks)


@needs_diffusers
def test_ltx_bench_smoke_run(tmp_path):
    out = _smoke("ltx_video.py", tmp_path, "--frames", "9,17")
    assert "| 9x64x96 | 12 | eager+kiln |" in out and "| 17x64x96 | 18 | eager+kiln |" in out
    [doc_path] = [p for p in tmp_path.glob("ltx_video-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    assert [c["frames"] for c in doc["cases"]] == [9, 17]
    for case in doc["cases"]:
        assert set(case["settings"]) == {"eager", "eager+kiln"}
        assert case["settings"]["eager+kiln"]["error_vs_eager"]["finite"]
    assert doc_path.with_suffix(".md").exists()


# ---- Llama ------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers", reason="transformers is not installed")


def test_llama_config_and_model_shapes():
    llama = load_bench("llama")
    config = llama.llama_config(4)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (4096, 14336, 4)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (32, 8, 128256)
    assert config.rope_parameters["rope_theta"] == 500000.0
    model = llama.build_model(config, device="meta")
    per_layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 2 * 4096  # q, o; k, v; mlp; norms
    assert sum(p.numel() for p in model.parameters()) == 2 * 128256 * 4096 + 4 * per_layer + 4096
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    inputs = llama.prefill_inputs(config, 2, 2048, device="cpu")
    assert inputs["input_ids"].shape == (2, 2048) and int(inputs["input_ids"].max()) < 128256


def test_llama_tiny_prefill_logits():
    llama = load_bench("llama")
    config = llama.llama_config(2, tiny=True)
    model = llama.build_model(config, device="cpu", dtype=torch.float32)
    inputs = llama.prefill_inputs(config, 2, 16, device="cpu")
    with torch.no_grad():
        last = model(**inputs).logits
        full = model(inputs["input_ids"]).logits
    assert last.shape == (2, 1, config.vocab_size)
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("model", ["llama", "deepseek-v3"])
def test_llama_decode_step_is_the_next_token_of_a_plain_forward(batch, model):
    """The decode step (static cache filled by a prefill, explicit position, 4-D mask, the
    cache's counter rewound each step) computes the logits a plain forward over the prompt
    and the new token gives at its last position, and the same on every repetition; the cache
    holds DeepSeek-V3's latent kv as its attention writes it."""
    llama = load_bench("llama")
    config = llama.llama_config(2, tiny=True, model=model)
    model = llama.build_model(config, device="cpu", dtype=torch.float32)
    past = 12
    cache, inputs, step = llama.decode_state(model, batch, past, device="cpu")
    prompt = torch.randint(0, config.vocab_size, (batch, past), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        first = step(model)
        again = step(model)
        expected = model(torch.cat([prompt, inputs["input_ids"]], dim=1)).logits[:, -1]
    assert first.shape == (batch, 1, config.vocab_size)
    torch.testing.assert_close(first[:, 0], expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(first, again)
    assert all(int(layer.cumulative_length) == past + 1 for layer in cache.layers)


def test_llama_bench_smoke_run(tmp_path):
    out = _smoke("llama.py", tmp_path, "--past", "24", "--prefill", "2x16", "--layers", "2")
    assert "| prefill | 2x16 | eager+kiln |" in out and "| decode32 | batch 32, 24 past | eager+kiln |" in out
    [doc_path] = [p for p in tmp_path.glob("llama-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    assert [c["case"] for c in doc["cases"]] == ["prefill", "decode1", "decode32"]
    for case in doc["cases"]:
        err = case["settings"]["eager+kiln"]["error_vs_eager"]
        assert err["finite"] and err["max_rel"] < 5e-2
        assert case["patch"]["replaced"] == {"rms_norm": 5, "swiglu": 2, "rope": 2, "fused_add_rms_norm": 2}
        apart = case["settings"]["eager+kiln, residual norms apart"]
        assert apart["error_vs_eager"]["finite"] and apart["error_vs_eager"]["max_rel"] < 5e-2
    assert doc_path.with_suffix(".md").exists()


def test_qwen3_config_has_qwen3_8b_widths():
    llama = load_bench("llama")
    config = llama.llama_config(4, model="qwen3")
    assert type(config).__name__ == "Qwen3Config"
    assert (config.hidden_size, config.intermediate_size, config.head_dim) == (4096, 12288, 128)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (32, 8, 151936)
    assert config.rope_parameters["rope_theta"] == 1000000.0


def test_qwen3_bench_smoke_run_times_the_head_norms_both_ways(tmp_path):
    out = _smoke("llama.py", tmp_path, "--model", "qwen3", "--past", "24", "--prefill", "2x16", "--layers", "2",
                 "--cases", "prefill,decode1", "--apart", "head-norms")
    assert "Qwen3-8B-shaped decoder" in out and "| prefill | 2x16 | eager+kiln, head norms apart |" in out
    [doc_path] = [p for p in tmp_path.glob("qwen3-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    for case in doc["cases"]:
        fused, apart = case["settings"]["eager+kiln"], case["settings"]["eager+kiln, head norms apart"]
        for record in (fused, apart):
            assert record["error_vs_eager"]["finite"] and record["error_vs_eager"]["max_rel"] < 5e-2
        assert apart["speedup_vs"] == "eager"
        # The q/k norms stay patched as norms (the path that records a graph calls them).
        assert case["patch"]["replaced"] == {"rms_norm": 9, "swiglu": 2, "head_norm_rope": 2, "fused_add_rms_norm": 2}
        assert "eager+kiln, residual norms apart" not in case["settings"]


def test_phi4_mini_config_has_its_widths():
    llama = load_bench("llama")
    config = llama.llama_config(4, model="phi4-mini")
    assert type(config).__name__ == "Phi3Config"
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (3072, 8192, 200064)
    assert (config.num_attention_heads, config.num_key_value_heads) == (24, 8)
    assert config.rope_parameters["partial_rotary_factor"] == 0.75
    model = llama.build_model(config, device="meta")
    assert model.model.layers[0].mlp.gate_up_proj.weight.shape == (2 * 8192, 3072)
    assert model.model.rotary_emb.inv_freq.shape == (48,)  # 96 of each head's 128 columns rotated


def test_phi4_mini_bench_smoke_run_sets_each_new_pattern_apart(tmp_path):
    out = _smoke("llama.py", tmp_path, "--model", "phi4-mini", "--past", "24", "--prefill", "2x16", "--layers", "2",
                 "--cases", "prefill")
    assert "Phi-4-mini-shaped decoder" in out
    [doc_path] = [p for p in tmp_path.glob("phi4-mini-*.json") if "partial" not in p.name]
    [case] = json.loads(doc_path.read_text())["cases"]
    assert case["patch"]["replaced"] == {"rms_norm": 5, "swiglu": 2, "rope": 2, "fused_add_rms_norm": 2}
    for name in ("eager+kiln", "eager+kiln, residual norms apart", "eager+kiln, packed gates apart",
                 "eager+kiln, rope apart"):
        err = case["settings"][name]["error_vs_eager"]
        assert err["finite"] and err["max_rel"] < 5e-2, name


@needs_diffusers
def test_gated_feed_forward_bench_smoke_run(tmp_path):
    out = _smoke("gated_feed_forward.py", tmp_path)
    assert "| tiny geglu | geglu | 32 x 128 | 2x16 | eager+kiln |" in out
    [doc_path] = tmp_path.glob("gated-feed-forward-*.json")
    doc = json.loads(doc_path.read_text())
    assert [c["patch"]["replaced"] for c in doc["cases"]] == [{"geglu": 1}, {"swiglu": 1}]
    for case in doc["cases"]:
        err = case["settings"]["eager+kiln"]["error_vs_eager"]
        assert err["finite"] and err["max_rel"] < 5e-2


@needs_diffusers
def test_sdxl_unet_bench_smoke_run(tmp_path):
    out = _smoke("sdxl_unet.py", tmp_path)
    assert "| eager+kiln |" in out
    [doc_path] = tmp_path.glob("sdxl-unet-*.json")
    doc = json.loads(doc_path.read_text())
    # Each transformer block's three LayerNorms and its GEGLU; the GroupNorms are left, as such.
    assert doc["patch"]["replaced"] == {"layer_norm": 33, "geglu": 11}
    err = doc["settings"]["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 5e-2


@needs_diffusers
def test_wan_bench_smoke_run(tmp_path):
    out = _smoke("wan.py", tmp_path)
    assert "| eager+kiln |" in out
    [doc_path] = tmp_path.glob("wan-1.3b-*.json")
    doc = json.loads(doc_path.read_text())
    # Each block's seams and self-attention (its q/k norms and rotation in one launch), both
    # attentions' q/k norms as modules (the self-attention's run with autograd), three LayerNorms
    # (the seams' fallback) and the GELU; the output norm.
    assert doc["patch"]["replaced"] == {"adaln + gated_adaln": 2, "rms_norm_rope": 2, "rms_norm": 8,
                                        "layer_norm": 7, "gelu": 2}
    err = doc["settings"]["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 5e-2


@needs_diffusers
def test_flux_default_model_and_inputs():
    """FLUX.1-dev's transformer (built on the meta device) and the inputs FluxPipeline passes
    at 1024x1024: 4096 packed latent tokens of 64 channels, 512 text tokens, the guidance."""
    flux = load_bench("flux")
    model = flux.build_model(device="meta")
    config = model.config
    assert (config.num_layers, config.num_single_layers, config.num_attention_heads) == (19, 38, 24)
    assert config.guidance_embeds and 11.8e9 < sum(p.numel() for p in model.parameters()) < 12.0e9
    inputs = flux.build_inputs(dict(config), 1024, 1024, device="cpu")
    assert inputs["hidden_states"].shape == (1, 4096, 64)
    assert inputs["encoder_hidden_states"].shape == (1, 512, 4096)
    assert inputs["img_ids"].shape == (4096, 3) and inputs["img_ids"][-1].tolist() == [0, 63, 63]
    assert inputs["guidance"].tolist() == [3.5]
    assert not flux.build_model("schnell", layers=2, single_layers=3, device="meta").config.guidance_embeds


@needs_diffusers
def test_flux_bench_smoke_run(tmp_path):
    out = _smoke("flux.py", tmp_path)
    assert "| eager+kiln |" in out
    [doc_path] = tmp_path.glob("flux-dev-*.json")
    doc = json.loads(doc_path.read_text())
    replaced = doc["patch"]["replaced"]
    assert replaced["gated_adaln + gated_residual"] == 1 and replaced["gelu + gated_residual"] == 2
    err = doc["settings"]["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 5e-2


@needs_diffusers
def test_flux_bench_runs_ovis_image(tmp_path):
    """--model ovis-image: FLUX's blocks with a SwiGLU in each single block, no pooled text and
    no guidance; every attention and block patched."""
    out = _smoke("flux.py", tmp_path, "--model", "ovis-image")
    assert "Ovis-Image-7B-shaped transformer" in out
    [doc_path] = tmp_path.glob("flux-ovis-image-*.json")
    doc = json.loads(doc_path.read_text())
    assert doc["text_tokens"] == 5 and "pooled_projection_dim" not in doc["config"]
    replaced = doc["patch"]["replaced"]
    assert replaced["gated_adaln + gated_residual"] == 1 and replaced["swiglu + gated_residual"] == 2
    assert replaced["head_norm_rope"] == 3
    err = doc["settings"]["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 5e-2


@needs_diffusers
def test_flux_bench_with_fp8_storage_patches_beneath_the_casting_hooks(tmp_path):
    """--fp8-storage: the projections stored in fp8 (diffusers' layerwise casting), cast in hooks
    kiln.patch leaves around them; the patch takes what it takes without them."""
    out = _smoke("flux.py", tmp_path, "--fp8-storage")
    assert "projections stored in fp8" in out
    [doc_path] = tmp_path.glob("flux-dev-fp8-storage-*.json")
    doc = json.loads(doc_path.read_text())
    assert doc["weight_storage"].startswith("float8_e4m3fn")
    replaced = doc["patch"]["replaced"]
    assert replaced["gated_adaln + gated_residual"] == 1 and replaced["gelu + gated_residual"] == 2
    err = doc["settings"]["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 5e-2


@needs_diffusers
def test_first_forward_bench_smoke_run(tmp_path):
    """The first-forward bench's plumbing on the CPU: each model's config.json written from a
    meta-device build, prewarmed in a process that sees no GPU, then each mode in a process of
    its own, every output compared with eager's. Its timings and compile counts are the GPU's."""
    out = _smoke("first_forward.py", tmp_path, "--models", "wan,ltx-video", "--jobs", "2", settings=None)
    [doc_path] = tmp_path.glob("first-forward-*.json")
    doc = json.loads(doc_path.read_text())
    assert doc["arch"] == "sm_90" and list(doc["models"]) == ["wan", "ltx-video"]
    for record in doc["models"].values():
        assert record["prewarm"]["failed"] == 0 and record["prewarm"]["compiled"] > 0
        assert list(record["modes"]) == ["eager", "cold", "tuned cache", "prewarmed"]
        for mode in ("cold", "tuned cache", "prewarmed"):
            err = record["modes"][mode]["error_vs_eager"]
            assert err["finite"] and err["max_rel"] < 5e-2
    assert "| prewarmed |" in out


# ---- the examples -----------------------------------------------------------------------


def _example(*args):
    cmd = [sys.executable, os.path.join(ROOT, "examples", args[0]), *args[1:], "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_llama_example_tiny():
    out = _example("llama.py", "--tiny", "--new-tokens", "6")
    assert "kiln.patch: 11 replaced, 0 left" in out
    # fp32 on the CPU: the patched model's greedy tokens are the unpatched model's.
    assert "comparison: 6/6 greedy tokens equal" in out
    assert "kiln.unpatch: 11 modules restored" in out


def test_llama_example_from_checkpoint(tmp_path):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=96)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    out = _example("llama.py", str(tmp_path), "--new-tokens", "3")
    assert "1 layers, hidden 64" in out and "kiln.patch: 6 replaced, 0 left" in out
    assert "comparison: 3/3 greedy tokens equal" in out


@needs_diffusers
def test_ltx_example_tiny():
    out = _example("ltx_video.py", "--tiny")
    assert re.search(r"kiln\.patch: \d+ replaced, 0 left", out)
    assert "comparison: output (2, 48, 8)" in out and "max rel err" in out


@needs_diffusers
def test_ltx_example_from_checkpoint(tmp_path):
    from diffusers import LTXVideoTransformer3DModel

    ltx = load_bench("ltx_video")
    LTXVideoTransformer3DModel(**{**ltx.TINY, "num_layers": 1}).save_pretrained(tmp_path / "transformer")
    out = _example("ltx_video.py", str(tmp_path), "--frames", "9", "--height", "64", "--width", "96")
    assert "1 blocks, 2 heads x 16" in out and re.search(r"kiln\.patch: \d+ replaced, 0 left", out)
    assert "comparison: output (2, 12, 8)" in out


def test_deepseek_v3_config_has_its_dense_layers_widths():
    llama = load_bench("llama")
    config = llama.llama_config(3, model="deepseek-v3")
    assert type(config).__name__ == "DeepseekV3Config"
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (7168, 18432, 129280)
    assert (config.q_lora_rank, config.kv_lora_rank, config.qk_rope_head_dim, config.qk_nope_head_dim) == \
        (1536, 512, 64, 128)
    assert config.rope_interleave and config.first_k_dense_replace >= config.num_hidden_layers


def test_deepseek_v3_bench_smoke_run_patches_its_latent_attention(tmp_path):
    out = _smoke("llama.py", tmp_path, "--model", "deepseek-v3", "--past", "24", "--prefill", "2x16", "--layers",
                 "2", "--cases", "prefill,decode1", "--apart", "rope")
    assert "DeepSeek-V3 (dense layers)-shaped decoder" in out
    [doc_path] = [p for p in tmp_path.glob("deepseek-v3-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    for case in doc["cases"]:
        for name in ("eager+kiln", "eager+kiln, rope apart"):
            err = case["settings"][name]["error_vs_eager"]
            assert err["finite"] and err["max_rel"] < 5e-2
        # Each layer's input, post-attention and latent q and kv norms, the final norm.
        assert case["patch"]["replaced"] == {"rms_norm": 9, "swiglu": 2, "rope": 2, "fused_add_rms_norm": 2}


def test_qwen3_moe_bench_smoke_run_gates_its_experts_with_kiln(tmp_path):
    out = _smoke("llama.py", tmp_path, "--model", "qwen3-moe", "--past", "24", "--prefill", "2x16", "--layers", "2",
                 "--cases", "prefill,decode1")
    assert "Qwen3-30B-A3B-shaped decoder" in out
    [doc_path] = [p for p in tmp_path.glob("qwen3-moe-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    for case in doc["cases"]:
        for name in ("eager+kiln", "eager+kiln, experts apart"):
            err = case["settings"][name]["error_vs_eager"]
            assert err["finite"] and err["max_rel"] < 5e-2
        assert case["patch"]["replaced"]["swiglu"] == 2  # each layer's experts


def test_llama4_bench_smoke_run_gates_its_experts_with_kiln(tmp_path):
    out = _smoke("llama.py", tmp_path, "--model", "llama4", "--prefill", "2x16", "--layers", "2")
    assert "Llama-4-Scout-shaped decoder" in out
    [doc_path] = [p for p in tmp_path.glob("llama4-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    assert [case["case"] for case in doc["cases"]] == ["prefill"]  # no decode step for Llama 4
    for case in doc["cases"]:
        for name in ("eager+kiln", "eager+kiln, experts apart", "eager+kiln, rope apart"):
            err = case["settings"][name]["error_vs_eager"]
            assert err["finite"] and err["max_rel"] < 5e-2
        assert case["patch"]["replaced"]["swiglu"] == 4  # each layer's experts and shared expert
        assert case["patch"]["replaced"]["rope"] == 2  # each attention's complex-frequency RoPE


def test_gpt_oss_bench_smoke_run_gates_its_experts_with_kiln(tmp_path):
    out = _smoke("llama.py", tmp_path, "--model", "gpt-oss", "--prefill", "2x16", "--layers", "2")
    assert "GPT-OSS-20B-shaped decoder" in out
    [doc_path] = [p for p in tmp_path.glob("gpt-oss-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    assert [case["case"] for case in doc["cases"]] == ["prefill"]  # no decode step for GPT-OSS
    for case in doc["cases"]:
        for name in ("eager+kiln", "eager+kiln, experts apart"):
            err = case["settings"][name]["error_vs_eager"]
            assert err["finite"] and err["max_rel"] < 5e-2
        assert case["patch"]["replaced"]["clamped_swiglu"] == 2  # each layer's experts


def test_settings_table_shows_kernel_time_where_measured():
    """A model bench's table gains the kernels' GPU time and its ratio to the base setting's
    where the records carry kernel_ms (a host-bound model's ms follows its host); off the GPU
    kernel_ms measures nothing."""
    common = load_bench("common")
    settings = {"eager": {"ms": 10.0, "host_ms": 9.9, "first_call_s": 0.1, "kernel_ms": 8.0},
                "eager+kiln": {"ms": 9.0, "host_ms": 8.9, "first_call_s": 0.2, "kernel_ms": 5.0,
                               "speedup_vs": "eager", "speedup": 10.0 / 9.0,
                               "error_vs_eager": {"max_rel": 1e-3, "mean_rel": 1e-4, "finite": True}}}
    lines = common.settings_table({"settings": settings, "patch": None})
    assert lines[0].startswith("| setting | ms | host ms | kernel ms | kernels vs base |")
    assert lines[1].count("---") == 9
    assert lines[3].startswith("| eager+kiln | 9.000 | 8.90 | 5.000 | 1.60x | 1.11x vs eager |")
    del settings["eager"]["kernel_ms"], settings["eager+kiln"]["kernel_ms"]
    assert common.settings_table({"settings": settings, "patch": None})[0].startswith("| setting | ms | host ms | speedup |")
    if not torch.cuda.is_available():
        assert common.kernel_ms(lambda: None) is None


def test_inkling2_bench_smoke_run_normalises_its_fp32_stream_with_kiln(tmp_path):
    pytest.importorskip("transformers.models.inkling2")
    out = _smoke("llama.py", tmp_path, "--model", "inkling2", "--prefill", "2x16")
    assert "Inkling-2-shaped decoder: 6 layers" in out
    [doc_path] = [p for p in tmp_path.glob("inkling2-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    assert [case["case"] for case in doc["cases"]] == ["prefill"]  # no decode step for Inkling 2
    for case in doc["cases"]:
        err = case["settings"]["eager+kiln"]["error_vs_eager"]
        assert err["finite"] and err["max_rel"] < 5e-2
        # Every RMSNorm: 16 weighted (the embedding's, the layers', the final one), 18 unweighted
        # (the attention residuals' and the value heads'), no MLP (the experts' gate is left).
        assert case["patch"]["replaced"] == {"rms_norm": 34}


@pytest.mark.parametrize("model", ["2b", "5b"])
def test_cogvideox_bench_smoke_run_modulates_its_affine_norms_with_kiln(tmp_path, model):
    pytest.importorskip("diffusers")
    out = _smoke("cogvideox.py", tmp_path, "--model", model)
    assert f"CogVideoX {model}-shaped transformer" in out
    [doc_path] = [p for p in tmp_path.glob(f"cogvideox-{model}-*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    err = doc["settings"]["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 5e-2
    # Each block's two CogVideoXLayerNormZero and the output AdaLayerNorm; both attentions.
    assert doc["patch"]["replaced"]["adaln"] == 5 and doc["patch"]["replaced"]["rope"] == 2
    if model == "5b":  # the rotation left to diffusers, beside
        err = doc["settings"]["eager+kiln, rotation apart"]["error_vs_eager"]
        assert err["finite"] and err["max_rel"] < 5e-2


def _transformer_smoke(tmp_path, script, cls, name, *args):
    """A --tiny run of a diffusion transformer's bench (skipped where diffusers lacks ``cls``):
    its printed output and the patch's replaced counts, once eager + kiln's and the blocks-apart
    setting's outputs are checked against eager's."""
    diffusers = pytest.importorskip("diffusers")
    if not hasattr(diffusers, cls):
        pytest.skip(f"this diffusers has no {cls}")
    out = _smoke(script, tmp_path, *args)
    [doc_path] = [p for p in tmp_path.glob(f"{name}-2*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    for setting in ("eager+kiln", "eager+kiln, blocks apart"):
        err = doc["settings"][setting]["error_vs_eager"]
        assert err["finite"] and err["max_rel"] < 5e-2
    return out, doc["patch"]["replaced"]


@pytest.mark.parametrize("edit", [False, True])
def test_qwen_image_bench_smoke_run_fuses_its_blocks_and_attention(tmp_path, edit):
    out, replaced = _transformer_smoke(tmp_path, "qwen_image.py", "QwenImageTransformer2DModel",
                                       "qwen-image-edit" if edit else "qwen-image", *(["--edit"] if edit else []))
    assert "Qwen-Image" in out
    # Both blocks and their attentions, the output AdaLN.
    assert replaced["adaln + gated_adaln + gated_residual"] == 2 and replaced["head_norm_rope"] == 2
    assert replaced["adaln"] == 1


def test_flux2_bench_smoke_run_fuses_its_blocks_and_attentions(tmp_path):
    out, replaced = _transformer_smoke(tmp_path, "flux2.py", "Flux2Transformer2DModel", "flux2-dev")
    assert "FLUX.2-dev-shaped transformer" in out
    # The double block, both single blocks, every attention, every SwiGLU.
    assert replaced["adaln + gated_adaln + gated_residual"] == 1 and replaced["adaln + gated_residual"] == 2
    assert replaced["head_norm_rope"] == 3 and replaced["swiglu"] == 4


def test_flux3_bench_smoke_run_fuses_its_blocks_and_attentions(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    if not hasattr(diffusers, "Flux3Transformer2DModel"):
        pytest.skip("this diffusers has no Flux3Transformer2DModel")
    out = _smoke("flux3.py", tmp_path, "--reference")
    assert "FLUX.3-shaped transformer" in out and "image and reference" in out
    [doc_path] = [p for p in tmp_path.glob("flux3-2*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    for setting in ("eager+kiln", "eager+kiln, blocks apart", "eager+kiln, FLUX.3 apart"):
        err = doc["settings"][setting]["error_vs_eager"]
        assert err["finite"] and err["max_rel"] < 5e-2
    # Every attention (one per-mode block a mode, three modes, two joint blocks), every SwiGLU,
    # every block's seams and the output norm.
    replaced = doc["patch"]["replaced"]
    assert replaced["head_norm_rope"] == 5 and replaced["swiglu"] == 5
    assert replaced["adaln + gated_residual"] == 5 and replaced["adaln"] == 1


@pytest.mark.parametrize("version, rope", [("2.0", "split"), ("2.0", "interleaved"), ("2.3", "split")])
def test_ltx2_bench_smoke_run_fuses_its_blocks_and_attentions(tmp_path, version, rope):
    name = ("ltx2" if version == "2.0" else "ltx2.3") + ("" if rope == "split" else "-interleaved")
    out, replaced = _transformer_smoke(tmp_path, "ltx2.py", "LTX2VideoTransformer3DModel", name, "--rope", rope,
                                       "--model", version)
    assert f"LTX-{version}-shaped transformer" in out
    # Both blocks and their six attentions each (interleaved: norms and rotation fused where the
    # two take one table, the self-attentions), the two output LayerNorms.
    assert replaced["adaln + gated_adaln + gated_residual"] == 2 and replaced["layer_norm"] == 2
    assert replaced["rope" if rope == "split" else "rms_norm_rope"] == 12


def test_z_image_bench_smoke_run_fuses_its_blocks_attentions_and_feed_forwards(tmp_path):
    out, replaced = _transformer_smoke(tmp_path, "z_image.py", "ZImageTransformer2DModel", "z-image")
    assert "Z-Image-shaped transformer" in out
    # The three modulated blocks, every attention and feed-forward (the caption refiner's too).
    assert replaced["adaln + gated_adaln + gated_residual"] == 3
    assert replaced["head_norm_rope"] == 4 and replaced["swiglu"] == 4


def test_qwen_image21_bench_smoke_run_fuses_its_blocks_and_feed_forwards(tmp_path):
    out, replaced = _transformer_smoke(tmp_path, "qwen_image21.py", "QwenImage21Transformer2DModel", "qwen-image21")
    assert "Qwen-Image-2.1-shaped transformer" in out
    assert replaced["adaln + gated_adaln + gated_residual"] == 2 and replaced["swiglu"] == 2
    assert replaced["head_norm_rope"] == 2


def test_stable_audio3_bench_smoke_run_takes_its_blocks_norms_and_feed_forwards(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    if not hasattr(diffusers, "StableAudio3DiTModel"):
        pytest.skip("this diffusers has no StableAudio3DiTModel")
    out = _smoke("stable_audio3.py", tmp_path)
    assert "Stable-Audio-3-shaped DiT" in out
    [doc_path] = [p for p in tmp_path.glob("stable-audio3-2*.json") if "partial" not in p.name]
    doc = json.loads(doc_path.read_text())
    err = doc["settings"]["eager+kiln"]["error_vs_eager"]
    assert err["finite"] and err["max_rel"] < 5e-2
    # Each block's seams, its seven RMSNorms and its feed-forward; nothing left.
    assert doc["patch"] == {"replaced": {"adaln + gated_adaln + gated_residual": 2, "rms_norm": 14, "swiglu": 2},
                            "left": 0}


@pytest.mark.parametrize("version", ["1.0", "1.5", "image"])
def test_hunyuan_video_bench_smoke_run_fuses_its_blocks_and_attentions(tmp_path, version):
    name, cls = {"1.0": ("hunyuan-video", "HunyuanVideoTransformer3DModel"),
                 "1.5": ("hunyuan-video-1.5", "HunyuanVideo15Transformer3DModel"),
                 "image": ("hunyuan-image", "HunyuanImageTransformer2DModel")}[version]
    out, replaced = _transformer_smoke(tmp_path, "hunyuan_video.py", cls, name, "--model", version)
    assert f"HunyuanVideo {version}-shaped transformer" in out
    if version != "1.5":  # one double and two single blocks, each with its attention
        assert replaced["gated_adaln + gated_residual"] == 1 and replaced["gelu + gated_residual"] == 2
        assert replaced["head_norm_rope"] == 3
    else:  # two double blocks
        assert replaced["gated_adaln + gated_residual"] == 2 and replaced["head_norm_rope"] == 2


def test_mochi_bench_smoke_run_fuses_its_blocks_and_attentions(tmp_path):
    out, replaced = _transformer_smoke(tmp_path, "mochi.py", "MochiTransformer3DModel", "mochi")
    assert "Mochi-shaped transformer" in out
    # The three blocks and their attentions (each rotation one kiln.rope), every SwiGLU.
    assert replaced["adaln + gated_adaln"] == 3 and replaced["rope"] == 3 and replaced["swiglu"] == 5


def test_chroma_bench_smoke_run_fuses_its_blocks(tmp_path):
    out, replaced = _transformer_smoke(tmp_path, "chroma.py", "ChromaTransformer2DModel", "chroma")
    assert "Chroma-shaped transformer" in out
    # The tiny model's two double and two single blocks, their pruned AdaLN modules and the output's.
    assert replaced["gated_adaln + gated_residual"] == 2 and replaced["gelu + gated_residual"] == 2
    assert replaced["adaln"] == 7


def test_skyreels_v2_bench_smoke_run_fuses_its_blocks(tmp_path):
    out, replaced = _transformer_smoke(tmp_path, "skyreels_v2.py", "SkyReelsV2Transformer3DModel",
                                       "skyreels-v2-df-1.3b", "--causal-block", "3")
    assert "SkyReels-V2 1.3b-shaped transformer" in out
    # The tiny model's two blocks and their self-attentions.
    assert replaced["adaln + gated_adaln"] == 2 and replaced["rms_norm_rope"] == 2


@pytest.mark.parametrize("script", ["chroma", "skyreels_v2"])
def test_blocks_apart_leaves_the_blocks_alone(script):
    """The benches' "blocks apart" setting leaves the blocks to diffusers and patches the rest
    (the attentions among it), as the setting's name says."""
    diffusers = pytest.importorskip("diffusers")
    bench = load_bench(script)
    cls = "ChromaTransformer2DModel" if script == "chroma" else "SkyReelsV2Transformer3DModel"
    if not hasattr(diffusers, cls):
        pytest.skip(f"this diffusers has no {cls}")
    if script == "chroma":
        model = bench.build_model(tiny=True, device="cpu")
    else:
        model = bench.wan.build_model("1.3b", tiny=True, device="cpu", cls=cls)
    kinds = [r.kind for r in bench.blocks_apart(kiln)(model).replaced]
    assert not any("block" in kind for kind in kinds)
    assert any(kind.endswith("attention (q/k rms_norm + rope)") or kind.startswith("flux attention")
               for kind in kinds)
    kiln.unpatch(model)


def test_sd3_bench_smoke_run_fuses_its_blocks(tmp_path):
    out, replaced = _transformer_smoke(tmp_path, "sd3.py", "SD3Transformer2DModel", "sd3.5-large")
    assert "SD3.5 large-shaped transformer" in out
    # The tiny model's three joint blocks (the first with a second attention, the last ending the text).
    assert replaced["gated_adaln + gated_residual"] == 3
