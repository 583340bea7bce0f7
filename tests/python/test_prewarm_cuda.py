"""A cache pre-warmed on a machine with no GPU serves the first op call on a GPU with no NVRTC
compile and no tuning (the prewarm record decides the config; see jit/prewarm.h)."""

import json
import os

import pytest

import kiln
from cache_helpers import run_kiln
from linear_attention_models import PREFIX, tiny_config, transformers_modules

PREWARM = """
import json, kiln
assert kiln.device_count() == 0, "the prewarm must run with no GPU visible"
print(json.dumps(kiln.prewarm("rms_norm", "bf16,fp16", [4096, 2000], "{arch}", jobs=2)))
"""

FIRST_CALLS = """
import json, torch, kiln
worst = 0.0
for dtype, hidden in ((torch.bfloat16, 4096), (torch.float16, 2000)):
    # 37 rows: fewer than the SMs, served the record's range for them; 1000: its winner.
    for rows in (37, 1000):
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        y = kiln.rms_norm(x, w, 1e-6)
        x64, w64 = x.double(), w.double()
        ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
        worst = max(worst, ((y.double() - ref).abs() / (ref.abs() + 1)).max().item())
torch.cuda.synchronize()
s = kiln.stats()
kernels = kiln._C.loaded_kernels()
print(json.dumps({**s, "worst": worst, "kernels": kernels}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["rw", "strict"])
def test_cache_prewarmed_without_gpu_serves_first_gpu_call_with_zero_compiles(tmp_path, mode):
    arch = kiln.device_info(0)["arch"]
    cache = tmp_path / "cache"
    code, warmed, err = run_kiln(PREWARM.format(arch=arch), cache, {"CUDA_VISIBLE_DEVICES": ""})
    assert code == 0, err
    # 2 dtypes x 2 sizes x with and without weight, each its heuristic and its config for
    # calls of at most one row per SM
    assert warmed["compiled"] == 16 and warmed["failed"] == 0, warmed

    manifest = tmp_path / "recorded.jsonl"
    code, stats, err = run_kiln(FIRST_CALLS, cache, {"KILN_CACHE": mode, "KILN_TUNE": "fast",
                                                     "KILN_RECORD": str(manifest)})
    assert code == 0, err
    print(f"first GPU calls from a cache prewarmed with no GPU ({mode}): {stats}")
    assert stats["nvrtc_compiles"] == 0 and stats["compiles"] == 0
    assert stats["tunes"] == 0
    assert stats["binary_hits"] == 4
    assert stats["worst"] < 2e-2
    assert len(stats["kernels"]) == 4
    for kernel in stats["kernels"]:
        assert kernel["from_prewarm"] and kernel["heuristic_only"], kernel
        _, dtype, hidden, flags, align = kernel["problem"].split(".")  # rms_norm.bf16.h4096.f1.a16
        # the heuristic this GPU's SM count gives the bucket (the record compiled it)
        expected = kiln.compile("rms_norm", dtype, int(hidden[1:]), arch="native",
                                flags=int(flags[1:]), align=int(align[1:]),
                                rows=kernel["rows_bucket"])["config"]
        assert kernel["config"] == expected, kernel
    if kiln.device_info(0)["sm_count"] >= 64:  # 37 rows (bucket 64) are one wave of single rows
        for problem in {k["problem"] for k in stats["kernels"]}:
            by_bucket = {k["rows_bucket"]: k["config"] for k in stats["kernels"]
                         if k["problem"] == problem}
            assert by_bucket[64] != by_bucket[1024], by_bucket
    records = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert {(r["dtype"], r["hidden"], r["arch"]) for r in records} == {
        ("bf16", 4096, arch), ("fp16", 2000, arch)}


# One bf16 rms_norm call of {rows} x 4096 in a fresh process: its statistics, the kernels it
# loaded, and its error against fp64.
ONE_CALL = """
import json, torch, kiln
x = torch.randn({rows}, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
y = kiln.rms_norm(x, w, 1e-6)
x64, w64 = x.double(), w.double()
ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
torch.cuda.synchronize()
print(json.dumps({{**kiln.stats(), "kernels": kiln._C.loaded_kernels(),
                  "worst": ((y.double() - ref).abs() / (ref.abs() + 1)).max().item()}}))
"""


@pytest.mark.gpu
def test_prewarm_tune_stores_what_the_first_call_uses(tmp_path):
    """`kiln prewarm --tune` on a GPU measures and stores the tuning result, so the first op
    call of a later process reads it (a tuning hit) and neither tunes nor compiles."""
    from test_prewarm import kiln_cli

    cli = kiln_cli()
    if cli is None:
        pytest.skip("the kiln command is not installed (set KILN_CLI)")
    import subprocess

    cache = tmp_path / "cache"
    done = subprocess.run([cli, "prewarm", "--op", "rms_norm", "--dtype", "bf16", "--hidden", "4096",
                           "--tune", "--rows", "1024", "--cache-dir", str(cache)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    print(done.stdout, done.stderr)
    assert list((cache / "v1" / "tune").rglob("rms_norm.bf16.h4096.*.json")), "no tuning result stored"
    code, stats, err = run_kiln(ONE_CALL.format(rows=1024), cache, {"KILN_TUNE": "fast"})
    assert code == 0, err
    print(f"first call after prewarm --tune: {stats}")
    assert stats["tunes"] == 0 and stats["compiles"] == 0
    assert stats["tuning_hits"] == 1
    assert stats["worst"] < 2e-2


TUNING_OFF_CALLS = """
import json, torch, kiln
w = torch.randn(5120, device="cuda", dtype=torch.bfloat16)
for rows in (1, 128, 4096):
    kiln.rms_norm(torch.randn(rows, 5120, device="cuda", dtype=torch.bfloat16), w, 1e-6)
torch.cuda.synchronize()
print(json.dumps({"kernels": kiln._C.loaded_kernels(), "tunes": kiln.stats()["tunes"]}))
"""


@pytest.mark.gpu
def test_tuning_off_serves_the_heuristic_for_the_calls_rows(tmp_path):
    """KILN_TUNE=off: calls of at most one row per SM get the norms' latency config, larger
    calls the heuristic for any row count, as `kiln compile --rows` names them."""
    code, result, err = run_kiln(TUNING_OFF_CALLS, tmp_path / "cache", {"KILN_TUNE": "off"})
    assert code == 0, err
    assert result["tunes"] == 0
    configs = {k["rows_bucket"]: k["config"] for k in result["kernels"]}
    assert sorted(configs) == [1, 128, 4096]
    for bucket, config in configs.items():
        assert config == kiln.compile("rms_norm", "bf16", 5120, arch="native", rows=bucket)["config"]
    assert configs[1] != configs[4096]
    assert configs[4096] == kiln.compile("rms_norm", "bf16", 5120, arch="native")["config"]
    # 128 rows are one wave of single rows where the GPU has 128 SMs or more (an H100 or H200)
    one_wave = kiln.device_info(0)["sm_count"] >= 128
    assert (configs[128] == configs[1]) == one_wave


@pytest.mark.gpu
def test_strict_cache_with_only_the_row_blind_binary_serves_it(tmp_path):
    """A cache holding only the row-blind heuristic's binary (a `kiln compile` without rows, or
    an older kiln's KILN_TUNE=off run), under KILN_CACHE=strict: a call of few rows, whose own
    heuristic was never compiled, is served that binary rather than refused."""
    cache = tmp_path / "cache"
    before = kiln.settings()
    kiln.configure(cache_dir=str(cache))
    try:
        row_blind = kiln.compile("rms_norm", "bf16", 4096, arch="native", format="cubin")["config"]
        own = kiln.compile("rms_norm", "bf16", 4096, arch="native", format="ptx", rows=8)["config"]
    finally:
        kiln.configure(cache_dir=before["cache_dir"])
    assert own != row_blind
    code, result, err = run_kiln(ONE_CALL.format(rows=8), cache,
                                 {"KILN_CACHE": "strict", "KILN_TUNE": "off"})
    assert code == 0, err
    assert result["compiles"] == 0 and result["nvrtc_compiles"] == 0 and result["binary_hits"] == 1
    (kernel,) = result["kernels"]
    assert kernel["config"] == row_blind and kernel["rows_bucket"] == 8
    assert result["worst"] < 2e-2


def _prewarm_then_run(tmp_path, config, calls, training=False):
    """Prewarms the cache from `config` (a config.json) with no GPU visible (with the backward
    kernels where `training`), then runs `calls` (a script printing kiln's statistics, loaded
    kernels and patched ops) on the GPU with tuning off; returns (the prewarm's summary, the
    script's output, the problems it compiled)."""
    arch = kiln.device_info(0)["arch"]
    cache = tmp_path / "cache"
    code, warmed, err = run_kiln(
        f"import json, kiln\nprint(json.dumps(kiln.prewarm(dtypes='bf16', archs='{arch}', config='{config}', "
        f"jobs=4, training={training})))", cache, {"CUDA_VISIBLE_DEVICES": ""})
    assert code == 0, err
    assert warmed["failed"] == 0, warmed
    code, stats, err = run_kiln(calls, cache, {"KILN_TUNE": "off"})
    assert code == 0, err
    return warmed, stats, sorted(k["problem"] for k in stats["kernels"] if not k["from_prewarm"])


# A tiny linear-attention model (its config written as transformers writes config.json), patched
# and run in bf16: the kernels it loaded, what it compiled, and its statistics.
MODEL_CALLS = """
import importlib, json, torch, kiln
modeling = importlib.import_module("transformers.models.{name}.modeling_{name}")
configuration = importlib.import_module("transformers.models.{name}.configuration_{name}")
config = getattr(configuration, "{config_class}").from_json_file("{config}")
config._attn_implementation = "eager"
torch.manual_seed(0)
model = getattr(modeling, "{model_class}")(config).eval().to("cuda", torch.bfloat16)
report = kiln.patch(model)
with torch.no_grad():
    model(torch.randint(0, 128, (2, 16), device="cuda"))
torch.cuda.synchronize()
print(json.dumps({{**kiln.stats(), "kernels": kiln._C.loaded_kernels(),
                  "ops": sorted({{r.op for r in report.replaced}})}}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5"])
def test_prewarm_from_config_serves_a_patched_linear_attention_model(tmp_path, name):
    """kiln prewarm --config of a Qwen3-Next / Qwen3.5 config.json, with no GPU, compiles every
    kernel the patched model then calls (the partial-rotary head_norm_rope, the gated norm of
    its linear attention, the Gemma norms, the shared expert's swiglu): its first forward on a
    GPU compiles nothing."""
    _, _, config_class = transformers_modules(name)
    extra = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
             "shared_expert_intermediate_size": 128} if name == "qwen3_next" else {}
    config = tiny_config(name, hidden=256, head_dim=64, vocab_size=128, **extra)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    calls = MODEL_CALLS.format(name=name, config_class=config_class, model_class=f"{PREFIX[name]}ForCausalLM",
                               config=path)
    warmed, stats, compiled = _prewarm_then_run(tmp_path, path, calls)
    print(f"{name}: prewarmed {warmed['compiled']}, patched {stats['ops']}, compiled on the GPU: {compiled}")
    assert "rms_norm_gated" in stats["ops"] and "head_norm_rope" in stats["ops"]
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled


# A tiny transformers model from its config.json (transformers' default experts implementation
# where it has experts), patched and run in bf16: without autograd, or (TRAIN) forward and
# backward.
CAUSAL_LM_CALLS = """
import json, torch, kiln, transformers
TRAIN = {train}
config = transformers.AutoConfig.from_pretrained("{config}")
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
model = model.train(TRAIN).to("cuda", torch.bfloat16)
report = kiln.patch(model)
with torch.set_grad_enabled(TRAIN):
    logits = model(torch.randint(0, 128, (2, 16), device="cuda")).logits
    if TRAIN:
        logits.float().square().mean().backward()
torch.cuda.synchronize()
print(json.dumps({{**kiln.stats(), "kernels": kiln._C.loaded_kernels(),
                  "ops": sorted({{r.op for r in report.replaced}})}}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("rope_interleave, training", [(None, False), (False, False), (None, True)])
def test_prewarm_from_config_serves_a_patched_latent_attention_model(tmp_path, rope_interleave, training):
    """kiln prewarm --config of a DeepSeek-V3 config.json (as the checkpoint writes it, without
    rope_interleave, so transformers de-interleaves; or with it false) compiles the RoPE its
    patched latent attention calls: 64 rotated columns of each q head and one k head, views of
    the projections; with --training, the backward kernels too. Its first forward (and
    backward) on a GPU compiles nothing."""
    configuration = pytest.importorskip("transformers.models.deepseek_v3.configuration_deepseek_v3")
    config = configuration.DeepseekV3Config(
        vocab_size=128, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=64,
        qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1, rope_interleave=bool(rope_interleave))
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    if rope_interleave is None:
        written = json.loads(path.read_text())
        del written["rope_interleave"]
        path.write_text(json.dumps(written))
    calls = CAUSAL_LM_CALLS.format(config=path, train=training)
    warmed, stats, compiled = _prewarm_then_run(tmp_path, path, calls, training)
    print(f"deepseek_v3 rope_interleave={rope_interleave} training={training}: prewarmed {warmed['compiled']}, "
          f"patched {stats['ops']}, compiled on the GPU: {compiled}")
    assert "rope" in stats["ops"]
    # The rotation ran in kiln, in the config's form: de-interleaved (flags 512) from a half
    # table (128), or rotate_half from the full table; training, its inverse (4) on the
    # gradients, positions inner (8).
    ropes = {k["problem"] for k in stats["kernels"] if k["problem"].startswith("rope.bf16.h64.")}
    forward = "rope.bf16.h64.f640.a16" if rope_interleave is None else "rope.bf16.h64.f0.a16"
    assert ropes == ({forward, "rope.bf16.h64.f652.a16"} if training else {forward}), ropes
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled


@pytest.mark.gpu
@pytest.mark.parametrize("training", [False, True])
def test_prewarm_from_config_serves_a_patched_moe_models_experts(tmp_path, training):
    """kiln prewarm --config of a Qwen3-MoE config.json compiles the SwiGLU its patched experts
    call on every routed token's packed gate_up (moe_intermediate_size, grouped_mm, transformers'
    default on CUDA); with --training, its backward too. The first forward (and backward) on a
    GPU compiles nothing."""
    configuration = pytest.importorskip("transformers.models.qwen3_moe.configuration_qwen3_moe")
    config = configuration.Qwen3MoeConfig(
        vocab_size=128, hidden_size=256, intermediate_size=512, moe_intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    warmed, stats, compiled = _prewarm_then_run(tmp_path, path, CAUSAL_LM_CALLS.format(config=path, train=training),
                                                training)
    print(f"qwen3_moe training={training}: prewarmed {warmed['compiled']}, patched {stats['ops']}, "
          f"compiled on the GPU: {compiled}")
    # The experts' packed gate (flags 0: rows of 2 x 192 read as they are).
    assert "swiglu.bf16.h192.f0.a16" in {k["problem"] for k in stats["kernels"]}
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled


@pytest.mark.gpu
@pytest.mark.parametrize("training", [False, True])
def test_prewarm_from_config_serves_rows_that_are_not_16_byte_multiples(tmp_path, training):
    """A model whose rows are not whole 16-byte multiples makes calls of a lower alignment (the
    host takes every row stride into it): a Qwen3 of width 100 (200-byte rows) with heads of 20
    (40 bytes, normalised and rotated in one call) and an MLP of 108, its norms and RoPE 8-byte
    aligned in bf16. kiln prewarm --config compiles them at that alignment, so the first forward
    (and backward) on a GPU compiles nothing."""
    configuration = pytest.importorskip("transformers.models.qwen3.configuration_qwen3")
    config = configuration.Qwen3Config(
        vocab_size=128, hidden_size=100, intermediate_size=108, num_hidden_layers=2, num_attention_heads=5,
        num_key_value_heads=5, head_dim=20)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    warmed, stats, compiled = _prewarm_then_run(tmp_path, path, CAUSAL_LM_CALLS.format(config=path, train=training),
                                                training)
    problems = {k["problem"] for k in stats["kernels"]}
    print(f"qwen3 of width 100 training={training}: prewarmed {warmed['compiled']}, patched {stats['ops']}, "
          f"loaded {sorted(problems)}, compiled on the GPU: {compiled}")
    assert any(p.startswith("rms_norm.bf16.h100.") and "a8" in p.split(".") for p in problems), problems
    assert any(p.startswith("rope.bf16.h20.") and "a8" in p.split(".") for p in problems), problems
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled


@pytest.mark.gpu
@pytest.mark.parametrize("training", [False, True])
def test_prewarm_from_config_serves_gpt_oss_experts_clamped_gate(tmp_path, training):
    """kiln prewarm --config of a GPT-OSS config.json compiles the clamped_swiglu its patched
    experts call on every routed token's packed gate_up (interleaved pairs, flag 128; grouped_mm)
    and its RoPE of half tables; with --training, the backward kernels too. The first forward
    (and backward) on a GPU compiles nothing."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no GPT-OSS")
    config = transformers.GptOssConfig(vocab_size=128, hidden_size=256, intermediate_size=192, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                       num_local_experts=4, num_experts_per_tok=2)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    warmed, stats, compiled = _prewarm_then_run(tmp_path, path, CAUSAL_LM_CALLS.format(config=path, train=training),
                                                training)
    print(f"gpt_oss training={training}: prewarmed {warmed['compiled']}, patched {stats['ops']}, "
          f"compiled on the GPU: {compiled}")
    assert "clamped_swiglu" in stats["ops"] and "rope" in stats["ops"]
    assert any(k["problem"].startswith("clamped_swiglu.bf16.h192.f129") for k in stats["kernels"])
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled


# A multimodal model's vision tower (its config.json as transformers writes it), patched and run
# in bf16 on one image of 8 x 8 patches (with autograd when training): the kernels it loaded,
# what it compiled, and its statistics.
TOWER_CALLS = """
import importlib, json, torch, kiln
modeling = importlib.import_module("transformers.models.{name}.modeling_{name}")
configuration = importlib.import_module("transformers.models.{name}.configuration_{name}")
vision = getattr(configuration, "{config_class}").from_json_file("{config}").vision_config
torch.manual_seed(0)
tower = getattr(modeling, "{tower_class}")(vision).to("cuda", torch.bfloat16)
report = kiln.patch(tower)
width = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
pixels = torch.randn(64, width, device="cuda", dtype=torch.bfloat16, requires_grad={train})
grid = torch.tensor([[1, 8, 8]], device="cuda")
with torch.set_grad_enabled({train}):
    out = tower(pixels, grid_thw=grid).pooler_output
    if {train}:
        out.float().square().sum().backward()
torch.cuda.synchronize()
print(json.dumps({{**kiln.stats(), "kernels": kiln._C.loaded_kernels(),
                  "ops": sorted({{r.op for r in report.replaced}})}}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "glm4v"])
@pytest.mark.parametrize("training", [False, True])
def test_prewarm_from_config_serves_a_patched_vision_tower(tmp_path, name, training):
    """kiln prewarm --config of a Qwen2.5-VL, Qwen3-VL or GLM-4V config.json compiles what the
    patched vision tower calls besides the language model: its norms (and Qwen3-VL's deepstack
    mergers' at 4x its width, GLM-4V's merger's at out_hidden_size), its SwiGLU or GELU, and RoPE
    over its 4 + 4 heads of 40 (Qwen3-VL: 72, its released heads' width) from the fp32 table;
    with --training, the backward kernels too. The tower's first forward (and backward) on a GPU
    compiles nothing."""
    transformers = pytest.importorskip("transformers")
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256)
    if name == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=dict(
            depth=2, hidden_size=160, intermediate_size=224, num_heads=4, out_hidden_size=64, patch_size=14,
            window_size=56, fullatt_block_indexes=[1]))
        config_class, tower_class, width = "Qwen2_5_VLConfig", "Qwen2_5_VisionTransformerPretrainedModel", 40
    elif name == "qwen3_vl":
        config = transformers.Qwen3VLConfig(text_config=dict(text, head_dim=16), vision_config=dict(
            depth=2, hidden_size=288, intermediate_size=224, num_heads=4, out_hidden_size=64, patch_size=16,
            num_position_embeddings=64, deepstack_visual_indexes=[1]))
        config_class, tower_class, width = "Qwen3VLConfig", "Qwen3VLVisionModel", 72
    else:
        config = transformers.Glm4vConfig(text_config=text, vision_config=dict(
            depth=2, hidden_size=160, intermediate_size=224, num_heads=4, out_hidden_size=64, patch_size=14))
        config_class, tower_class, width = "Glm4vConfig", "Glm4vVisionModel", 40
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    calls = TOWER_CALLS.format(name=name, config_class=config_class, tower_class=tower_class, config=path,
                               train=training)
    warmed, stats, compiled = _prewarm_then_run(tmp_path, path, calls, training)
    print(f"{name} training={training}: prewarmed {warmed['compiled']}, patched {stats['ops']}, "
          f"compiled on the GPU: {compiled}")
    assert "rope" in stats["ops"]
    # The tower's RoPE: an fp32 table (2), 4 + 4 heads (16 | 32).
    assert any(k["problem"].startswith(f"rope.bf16.h{width}.f50") for k in stats["kernels"]), stats["kernels"]
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled


# A MiniMax-M3-VL or Inkling 2 tower (and Inkling 2's language model) from its model's
# config.json, patched and run in bf16 on vision_towers' inputs.
OTHER_TOWER_CALLS = """
import importlib, json, sys, torch, kiln
sys.path.insert(0, {tests!r})
from vision_towers import other_tower_inputs
modeling = importlib.import_module("transformers.models.{name}.modeling_{name}")
configuration = importlib.import_module("transformers.models.{name}.configuration_{name}")
config = getattr(configuration, "{config_class}").from_json_file("{config}")
torch.manual_seed(0)
config.vision_config._attn_implementation = "sdpa"
tower = getattr(modeling, "{tower_class}")(config.vision_config).to("cuda", torch.bfloat16)
ops = {{r.op for r in kiln.patch(tower).replaced}}
with torch.no_grad():
    tower(**{{k: v.cuda() for k, v in other_tower_inputs(tower).items()}})
    if "{name}" == "inkling2":
        config.text_config._attn_implementation = "eager"
        language = modeling.Inkling2ForCausalLM(config.text_config).to("cuda", torch.bfloat16)
        for module in language.modules():
            if isinstance(module, modeling.Inkling2TopKRouter):
                module.float()
        ops |= {{r.op for r in kiln.patch(language).replaced}}
        language(torch.randint(0, 256, (2, 16), device="cuda"))
torch.cuda.synchronize()
print(json.dumps({{**kiln.stats(), "kernels": kiln._C.loaded_kernels(), "ops": sorted(ops)}}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["minimax_m3_vl", "inkling2"])
def test_prewarm_from_config_serves_towers_of_their_own_inputs(tmp_path, name):
    """kiln prewarm --config of a MiniMax-M3-VL config.json compiles its tower's RoPE in both forms
    transformers' releases run from it: the first 78 of 80 columns from [S, 78] bf16 tables
    (156-byte rows: 4-byte aligned calls), and each whole head (5.17's 2-D RoPE); of an Inkling 2
    one (no intermediate_size), its tower's interleaved RoPE and its language model's RMSNorms,
    in fp32 over its residual stream. Their first forwards on a GPU compile nothing."""
    configuration = pytest.importorskip(f"transformers.models.{name}.configuration_{name}")
    if name == "minimax_m3_vl":
        config = configuration.MiniMaxM3VLConfig(
            text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, vocab_size=256),
            vision_config=dict(hidden_size=160, intermediate_size=320, num_hidden_layers=2, num_attention_heads=2))
        classes = dict(config_class="MiniMaxM3VLConfig", tower_class="MiniMaxM3VLVisionModel")
    else:
        from vision_towers import inkling2_model_config
        config = inkling2_model_config()
        classes = dict(config_class="Inkling2Config", tower_class="Inkling2VisionModel")
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    calls = OTHER_TOWER_CALLS.format(name=name, config=path, tests=os.path.dirname(os.path.abspath(__file__)),
                                     **classes)
    warmed, stats, compiled = _prewarm_then_run(tmp_path, path, calls)
    problems = {k["problem"] for k in stats["kernels"]}
    print(f"{name}: prewarmed {warmed['compiled']}, patched {stats['ops']}, loaded {sorted(problems)}, "
          f"compiled on the GPU: {compiled}")
    assert "rope" in stats["ops"]
    if name == "minimax_m3_vl":
        assert any(p.startswith("rope.bf16.h80.") for p in problems), problems
    else:
        assert any(p.startswith("rms_norm.fp32.h64.f1.") for p in problems), problems
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["llama4_text", "deepseek_v2"])
def test_prewarm_from_config_serves_complex_frequency_rope_models(tmp_path, model_type):
    """kiln prewarm --config of a Llama 4 (experts as batched matmuls, a shared expert and a dense
    MLP of its own width, q/k head norms) or DeepSeek-V2 (latent attention) config.json compiles
    what their patched forward calls, RoPE by complex frequencies included (interleaved pairs
    from an fp32 half table). The first forward on a GPU compiles nothing."""
    transformers = pytest.importorskip("transformers")
    if model_type == "llama4_text":
        config = transformers.AutoConfig.for_model(
            model_type, vocab_size=128, hidden_size=256, intermediate_size=192, intermediate_size_mlp=384,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
            num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=True)
    else:
        config = transformers.AutoConfig.for_model(
            model_type, vocab_size=128, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None,
            qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=4, num_experts_per_tok=2,
            first_k_dense_replace=1, n_group=1, topk_group=1)
    path = tmp_path / "config.json"
    config.to_json_file(str(path))
    warmed, stats, compiled = _prewarm_then_run(tmp_path, path, CAUSAL_LM_CALLS.format(config=path, train=False),
                                                False)
    print(f"{model_type}: prewarmed {warmed['compiled']}, patched {stats['ops']}, compiled on the GPU: {compiled}")
    assert "rope" in stats["ops"] and "swiglu" in stats["ops"]
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled


# A tiny diffusers transformer from its config.json (as diffusers writes it), in bf16 (with
# what diffusers' loader keeps in fp32 in fp32), patched and run at batch 2: a timestep per
# sample, then (LTX-Video's conditioned frames, Wan 2.2's TI2V) a timestep per token; without
# autograd, or (TRAIN) forward and backward. Prints the kernels it loaded, its statistics and
# the ops kiln's patch replaced.
DIT_CALLS = """
import json, torch, kiln, diffusers
TRAIN = {train}
cls = getattr(diffusers, "{cls}")
config = cls.load_config("{directory}")
torch.manual_seed(0)
model = cls.from_config(config).train(TRAIN).to("cuda")
keep = getattr(model, "_keep_in_fp32_modules", None) or []
for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
    if not any(k in name.split(".") for k in keep):
        tensor.data = tensor.data.to(torch.bfloat16)
report = kiln.patch(model)
g = torch.Generator().manual_seed(3)
frames, height, width, text = 2, 2, 3, 5
tokens = frames * height * width
extra = {{}}
time_key = "timestep"
if "{cls}" == "FluxTransformer2DModel":
    frames = 1
    tokens = height * width
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(height * 1.0), torch.arange(width * 1.0),
                                     indexing="ij"), -1).reshape(tokens, 3)
    inputs = dict(hidden_states=torch.randn(2, tokens, config["in_channels"], generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["joint_attention_dim"], generator=g),
                  pooled_projections=torch.randn(2, config["pooled_projection_dim"], generator=g))
    extra = dict(img_ids=ids.cuda(), txt_ids=torch.zeros(text, 3, device="cuda"))
    timesteps = [torch.tensor([0.3, 0.7])]
elif "{cls}" == "ChromaTransformer2DModel":
    # FLUX's inputs without pooled projections; the prompt's padding masked as the pipeline masks it.
    tokens = height * width
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(height * 1.0), torch.arange(width * 1.0),
                                     indexing="ij"), -1).reshape(tokens, 3)
    inputs = dict(hidden_states=torch.randn(2, tokens, config["in_channels"], generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["joint_attention_dim"], generator=g))
    mask = torch.ones(2, text + tokens, dtype=torch.bool, device="cuda")
    mask[1, text - 2:text] = False
    extra = dict(img_ids=ids.cuda(), txt_ids=torch.zeros(text, 3, device="cuda"), attention_mask=mask)
    timesteps = [torch.tensor([0.3, 0.7])]
elif "{cls}" == "Flux2Transformer2DModel":
    tokens = height * width
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(height * 1.0), torch.arange(width * 1.0),
                                     torch.zeros(1), indexing="ij"), -1).reshape(tokens, 4)
    inputs = dict(hidden_states=torch.randn(2, tokens, config["in_channels"], generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["joint_attention_dim"], generator=g))
    extra = dict(img_ids=ids.cuda(), txt_ids=torch.zeros(text, 4, device="cuda"),
                 guidance=torch.full((2,), 4.0, device="cuda"))
    timesteps = [torch.tensor([0.3, 0.7])]
elif "{cls}" == "Flux3Transformer2DModel":
    # A reference image's tokens too (image editing), at t = 1 of its ids.
    tokens = height * width
    grid = torch.stack(torch.meshgrid(torch.arange(height * 1.0), torch.arange(width * 1.0), indexing="ij"), -1)
    ids = torch.cat([torch.zeros(tokens, 1), grid.reshape(tokens, 2), torch.zeros(tokens, 1)], -1)
    inputs = dict(hidden_states=torch.randn(2, tokens, config["in_channels"], generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["joint_attention_dim"], generator=g),
                  image_cond_hidden_states=torch.randn(2, tokens, config["cond_in_channels"], generator=g))
    extra = dict(img_ids=ids.cuda(), txt_ids=torch.zeros(text, 4, device="cuda"),
                 image_cond_ids=(ids + torch.tensor([1.0, 0.0, 0.0, 0.0])).cuda())
    timesteps = [torch.tensor([0.3, 0.7])]
elif "{cls}" == "QwenImageTransformer2DModel":
    images = 2 if config.get("zero_cond_t") else 1  # Qwen-Image-Edit-2511: a condition image too
    tokens = images * height * width
    inputs = dict(hidden_states=torch.randn(2, tokens, config["in_channels"], generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["joint_attention_dim"], generator=g))
    extra = dict(encoder_hidden_states_mask=torch.ones(2, text, dtype=torch.long, device="cuda"),
                 img_shapes=[[(1, height, width)] * images] * 2)
    timesteps = [torch.tensor([0.3, 0.7])]
elif "{cls}" == "CogVideoXTransformer3DModel":
    inputs = dict(hidden_states=torch.randn(2, frames, config["in_channels"], 2 * height, 2 * width, generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["text_embed_dim"], generator=g))
    if config["use_rotary_positional_embeddings"]:  # 5b: the pipeline's fp32 tables, interleaved pairs
        angles = torch.randn(tokens, config["attention_head_dim"] // 2, generator=g)
        extra = dict(image_rotary_emb=(angles.cos().repeat_interleave(2, -1).cuda(),
                                       angles.sin().repeat_interleave(2, -1).cuda()))
    timesteps = [torch.tensor([10, 500])]
elif "{cls}" == "LTX2VideoTransformer3DModel":
    # Without a caption projection (LTX-2.3) each stream's text comes at its attention's width.
    projected = config["use_prompt_embeddings"]
    inputs = dict(hidden_states=torch.randn(2, tokens, config["in_channels"], generator=g),
                  audio_hidden_states=torch.randn(2, 5, config["audio_in_channels"], generator=g),
                  encoder_hidden_states=torch.randn(
                      2, text, config["caption_channels" if projected else "cross_attention_dim"], generator=g),
                  audio_encoder_hidden_states=torch.randn(
                      2, text, config["caption_channels" if projected else "audio_cross_attention_dim"], generator=g))
    # sigma: LTX-2.3's text modulation reads it; the audio's timestep per sample (the video's may
    # be per token).
    extra = dict(num_frames=frames, height=height, width=width, audio_num_frames=5,
                 sigma=torch.tensor([0.01, 0.5], device="cuda"), audio_timestep=torch.tensor([10, 500], device="cuda"))
    timesteps = [torch.tensor([10, 500]), torch.randint(0, 1000, (2, tokens), generator=g)]
elif "{cls}" == "ZImageTransformer2DModel":
    # Lists of latents and captions (of two lengths: padded, masked), the timestep as t.
    inputs = dict(x=[torch.randn(config["in_channels"], 1, 2 * height, 2 * width, generator=g) for _ in range(2)],
                  cap_feats=[torch.randn(n, config["cap_feat_dim"], generator=g) for n in (text, text + 2)])
    timesteps = [torch.tensor([0.3, 0.7])]
    time_key = "t"
elif "{cls}" == "HunyuanImageTransformer2DModel":
    # An image's latents, padded prompts of both text encoders, the timestep in the model's dtype.
    inputs = dict(hidden_states=torch.randn(2, config["in_channels"], 2 * height, 2 * width, generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["text_embed_dim"], generator=g),
                  encoder_hidden_states_2=torch.randn(2, 4, config["text_embed_2_dim"], generator=g))
    extra = dict(encoder_attention_mask=torch.tensor([[1] * text, [1] * (text - 2) + [0] * 2], device="cuda"),
                 encoder_attention_mask_2=torch.tensor([[1] * 4, [1] * 2 + [0] * 2], device="cuda"))
    timesteps = [torch.tensor([10.0, 500.0]).bfloat16()]
elif "{cls}" in ("HunyuanVideoTransformer3DModel", "HunyuanVideo15Transformer3DModel"):
    # A padded prompt (its mask long, as the pipelines pass it); HunyuanVideo 1.5's second text
    # encoder's and an image's tokens too, its timestep in the model's dtype.
    inputs = dict(hidden_states=torch.randn(2, config["in_channels"], frames, height, width, generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["text_embed_dim"], generator=g))
    extra = dict(encoder_attention_mask=torch.tensor([[1] * text, [1] * (text - 2) + [0] * 2], device="cuda"))
    if "{cls}" == "HunyuanVideo15Transformer3DModel":
        inputs.update(encoder_hidden_states_2=torch.randn(2, 4, config["text_embed_2_dim"], generator=g),
                      image_embeds=torch.randn(2, 3, config["image_embed_dim"], generator=g))
        extra["encoder_attention_mask_2"] = torch.tensor([[1] * 4, [1] * 2 + [0] * 2], device="cuda")
        timesteps = [torch.tensor([10.0, 500.0]).bfloat16()]
    else:
        inputs["pooled_projections"] = torch.randn(2, config["pooled_projection_dim"], generator=g)
        extra["guidance"] = torch.full((2,), 3000.0, device="cuda")
        timesteps = [torch.tensor([10, 500])]
elif "{cls}" == "SD3Transformer2DModel":
    inputs = dict(hidden_states=torch.randn(2, config["in_channels"], 2 * height, 2 * width, generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["joint_attention_dim"], generator=g),
                  pooled_projections=torch.randn(2, config["pooled_projection_dim"], generator=g))
    timesteps = [torch.tensor([10, 500])]
elif "{cls}" == "MochiTransformer3DModel":
    # A padded prompt (its mask long, as the pipeline passes it).
    inputs = dict(hidden_states=torch.randn(2, config["in_channels"], frames, 2 * height, 2 * width, generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["text_embed_dim"], generator=g))
    extra = dict(encoder_attention_mask=torch.tensor([[1] * text, [1] * (text - 2) + [0] * 2], device="cuda"))
    timesteps = [torch.tensor([10, 500])]
elif "{cls}" == "SkyReelsV2Transformer3DModel":
    # Text to video (a timestep a sample), or diffusion forcing in causal frame blocks (a timestep
    # a frame: per-token modulation rows, the self-attention masked).
    inputs = dict(hidden_states=torch.randn(2, config["in_channels"], frames, 2 * height, 2 * width, generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["text_dim"], generator=g))
    forcing = config["num_frame_per_block"] > 1
    extra = dict(enable_diffusion_forcing=forcing)
    timesteps = [torch.tensor([[10] * frames, [500] * frames]) if forcing else torch.tensor([10, 500])]
elif "{cls}" == "WanVACETransformer3DModel":
    # The video's latents and the control stream's (the first control block projects it).
    inputs = dict(hidden_states=torch.randn(2, config["in_channels"], frames, 2 * height, 2 * width, generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["text_dim"], generator=g),
                  control_hidden_states=torch.randn(2, config["vace_in_channels"], frames, 2 * height, 2 * width,
                                                    generator=g))
    timesteps = [torch.tensor([10, 500])]
elif "{cls}" == "LTXVideoTransformer3DModel":
    inputs = dict(hidden_states=torch.randn(2, tokens, config["in_channels"], generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["caption_channels"], generator=g),
                  encoder_attention_mask=torch.ones(2, text))
    extra = dict(num_frames=frames, height=height, width=width)
    timesteps = [torch.tensor([10, 500]), torch.randint(0, 1000, (2, tokens), generator=g)]
else:
    inputs = dict(hidden_states=torch.randn(2, config["in_channels"], frames, 2 * height, 2 * width,
                                            generator=g),
                  encoder_hidden_states=torch.randn(2, text, config["text_dim"], generator=g))
    if config.get("image_dim"):  # image to video: the image encoder's tokens
        inputs["encoder_hidden_states_image"] = torch.randn(2, 7, config["image_dim"], generator=g)
    timesteps = [torch.tensor([10, 500]), torch.randint(0, 1000, (2, tokens), generator=g)]
inputs = {{k: [e.to("cuda", torch.bfloat16) for e in v] if isinstance(v, list) else v.to("cuda", torch.bfloat16)
          for k, v in inputs.items()}}
for timestep in timesteps:
    with torch.set_grad_enabled(TRAIN):
        out = model(**inputs, **extra, **{{time_key: timestep.cuda()}}, return_dict=False)[0]
    if TRAIN:
        (torch.stack(out) if isinstance(out, list) else out).float().square().mean().backward()
torch.cuda.synchronize()
print(json.dumps({{**kiln.stats(), "kernels": kiln._C.loaded_kernels(),
                  "ops": sorted({{r.op for r in report.replaced}})}}))
"""

# Each model's tiny config (diffusers' class, its arguments) and the block ops its patch must
# replace.
DIT_MODELS = {
    "flux": ("FluxTransformer2DModel", dict(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=24, pooled_projection_dim=12, guidance_embeds=False,
        axes_dims_rope=(4, 6, 6)), ("gated_adaln + gated_residual", "gelu + gated_residual")),
    "chroma": ("ChromaTransformer2DModel", dict(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=24, axes_dims_rope=(4, 6, 6), approximator_num_channels=8, approximator_hidden_dim=32,
        approximator_layers=1), ("gated_adaln + gated_residual", "gelu + gated_residual")),
    "ltx-video": ("LTXVideoTransformer3DModel", dict(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
        num_layers=2, caption_channels=24), ("adaln + gated_residual + gated_adaln",)),
    # A head dim of 16: diffusers' half tables have rows of 32 bytes, 16-byte aligned as real
    # Wan's (head dim 128) are.
    "wan": ("WanTransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=64, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32),
        ("adaln + gated_adaln",)),
    "skyreels-v2": ("SkyReelsV2Transformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=64, num_layers=2, rope_max_seq_len=32), ("adaln + gated_adaln",)),
    "skyreels-v2-df": ("SkyReelsV2Transformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=64, num_layers=2, rope_max_seq_len=32, num_frame_per_block=2),
        ("adaln + gated_adaln",)),
    "wan-vace": ("WanVACETransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=64, num_layers=2, rope_max_seq_len=32, vace_layers=[0, 1],
        vace_in_channels=6), ("adaln + gated_adaln",)),
    "wan-i2v": ("WanTransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=64, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32,
        image_dim=24, added_kv_proj_dim=32), ("adaln + gated_adaln",)),
    "flux2": ("Flux2Transformer2DModel", dict(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=24, axes_dims_rope=(4, 4, 4, 4), timestep_guidance_channels=16),
        ("adaln + gated_adaln + gated_residual", "adaln + gated_residual")),
    "qwen-image": ("QwenImageTransformer2DModel", dict(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, axes_dims_rope=(4, 6, 6)), ("adaln + gated_adaln + gated_residual",)),
    "qwen-image-edit": ("QwenImageTransformer2DModel", dict(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, axes_dims_rope=(4, 6, 6), zero_cond_t=True), ("adaln + gated_adaln + gated_residual",)),
    # Head dims of 16 and 8: rows and half tables 16-byte aligned, as real LTX-2's (128 and 64) are.
    "ltx2": ("LTX2VideoTransformer3DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=8,
        audio_cross_attention_dim=16, num_layers=2, caption_channels=16, rope_type="split"),
        ("adaln + gated_adaln + gated_residual",)),
    "ltx2.3": ("LTX2VideoTransformer3DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=8,
        audio_cross_attention_dim=16, num_layers=2, caption_channels=16, rope_type="split", gated_attn=True,
        cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True, perturbed_attn=True,
        use_prompt_embeddings=False), ("adaln + gated_adaln + gated_residual",)),
    # Head dims of 16: half tables of 32-byte rows, 16-byte aligned as real Z-Image's (128) are.
    "z-image": ("ZImageTransformer2DModel", dict(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2,
        n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6], axes_lens=[64, 16, 16]),
        ("adaln + gated_adaln + gated_residual",)),
    # Head dims of 16: table rows of 64 bytes, 16-byte aligned as real HunyuanVideo's (128) are.
    "hunyuan-video": ("HunyuanVideoTransformer3DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1, num_single_layers=2,
        num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=16, pooled_projection_dim=8,
        rope_axes_dim=(4, 6, 6)), ("gated_adaln + gated_residual", "gelu + gated_residual")),
    "hunyuan-image": ("HunyuanImageTransformer2DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1, num_single_layers=2,
        num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=12, rope_axes_dim=(8, 8)),
        ("gated_adaln + gated_residual", "gelu + gated_residual")),
    "hunyuan-video-1.5": ("HunyuanVideo15Transformer3DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
        num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=12, image_embed_dim=24, rope_axes_dim=(4, 6, 6)),
        ("gated_adaln + gated_residual",)),
    # Patches of 2 x 2, as Mochi's; the last block's text stream ends at its norm.
    "mochi": ("MochiTransformer3DModel", dict(
        patch_size=2, num_attention_heads=2, attention_head_dim=16, num_layers=2, pooled_projection_dim=24,
        in_channels=4, text_embed_dim=16, time_embed_dim=8, max_sequence_length=8),
        ("adaln + gated_adaln",)),
    # Its text length is its position embedding's (max_text_seq_length).
    "cogvideox": ("CogVideoXTransformer3DModel", dict(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=32,
        text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
        max_text_seq_length=5), ("gated_adaln + gated_residual",)),
    # SD3.5 Medium's form: per-head q/k RMSNorms, a dual-attention block; the last block's text
    # stream ends at its norm.
    "sd3.5-medium": ("SD3Transformer2DModel", dict(
        sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=3, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32, pooled_projection_dim=12,
        pos_embed_max_size=16, qk_norm="rms_norm", dual_attention_layers=(0,)),
        ("gated_adaln + gated_residual",)),
    "cogvideox-5b": ("CogVideoXTransformer3DModel", dict(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=32,
        text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
        max_text_seq_length=5, use_rotary_positional_embeddings=True), ("gated_adaln + gated_residual",)),
}

# What the patched attentions call without autograd: the q/k norms and rotation in one kernel
# (CogVideoX-2b's q/k LayerNorms alone: it rotates nothing; 5b's rotation is kiln.rope_ after them).
FUSED_ATTENTION = {"flux": "head_norm_rope", "chroma": "head_norm_rope",
                   "ltx-video": "rms_norm_rope (angles in-kernel)",
                   "wan": "rms_norm_rope", "wan-i2v": "rms_norm_rope", "skyreels-v2": "rms_norm_rope",
                   "skyreels-v2-df": "rms_norm_rope", "wan-vace": "rms_norm_rope", "qwen-image": "head_norm_rope",
                   "qwen-image-edit": "head_norm_rope", "cogvideox": "layer_norm", "flux2": "head_norm_rope",
                   "ltx2": "rope", "ltx2.3": "rope", "z-image": "head_norm_rope", "hunyuan-video": "head_norm_rope",
                   "hunyuan-video-1.5": "head_norm_rope", "hunyuan-image": "head_norm_rope", "mochi": "rope",
                   "cogvideox-5b": "rope", "sd3.5-medium": "rms_norm"}


def _prewarm_then_run_dit(tmp_path, name, training, models=DIT_MODELS):
    diffusers = pytest.importorskip("diffusers")
    cls, arguments, block_ops = models[name]
    if not hasattr(diffusers, cls):
        pytest.skip(f"this diffusers has no {cls}")
    directory = tmp_path / name
    getattr(diffusers, cls)(**arguments).save_config(str(directory))
    warmed, stats, compiled = _prewarm_then_run(
        tmp_path, directory / "config.json", DIT_CALLS.format(cls=cls, directory=directory, train=training),
        training)
    print(f"{name}: prewarmed {warmed['compiled']}, patched {stats['ops']}, loaded {len(stats['kernels'])}, "
          f"compiled on the GPU: {compiled}")
    assert set(block_ops) <= set(stats["ops"])
    assert compiled == [] and stats["nvrtc_compiles"] == 0, compiled
    return stats


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(DIT_MODELS))
def test_prewarm_from_config_serves_a_patched_diffusion_transformer(tmp_path, name):
    """kiln prewarm --config of a FLUX, Chroma, FLUX.2, LTX-Video, LTX-2, Wan, Wan VACE, SkyReels-V2,
    Qwen-Image, Z-Image, HunyuanVideo (1.5), HunyuanImage, Mochi, SD3 or CogVideoX config.json, with
    no GPU, compiles every kernel the patched transformer then calls without autograd (the blocks'
    AdaLN seams and gated residuals, a timestep per sample and per token, each attention's fused q/k
    norms and rotation, the cross-attention norms, FLUX's activation written into proj_out's input,
    the output norm: Wan's in fp32, as are the LayerNorms of Wan's image embedder for image to
    video): its first forwards on a GPU compile nothing."""
    stats = _prewarm_then_run_dit(tmp_path, name, training=False)
    assert FUSED_ATTENTION[name] in stats["ops"]
    assert any(k["problem"].startswith(("adaln.", "gated_adaln.")) for k in stats["kernels"])


# Models whose patch takes their attentions and feed-forwards but not their blocks' seams.
ATTENTION_ONLY_DIT_MODELS = {
    # Head dims of 16: table rows of 64 bytes, 16-byte aligned as real FLUX.3's (128) are.
    "flux3": ("Flux3Transformer2DModel", dict(
        in_channels=8, cond_in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=24, timestep_channels=16, axes_dims_rope=(4, 4, 4, 4)),
        ("head_norm_rope", "swiglu")),
}


@pytest.mark.gpu
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", list(ATTENTION_ONLY_DIT_MODELS))
def test_prewarm_from_config_serves_a_patched_dit_attentions(tmp_path, name, training):
    """kiln prewarm --config (--training) of a FLUX.3 config.json, with no GPU, compiles every
    kernel the patched transformer then calls: its attentions' fused fp32 q/k norms and rotation
    (the norms' weights kept in fp32 by the loader), its LayerNorms and packed SwiGLU; with
    autograd, the fp32 norms and kiln.rope with their backward kernels."""
    stats = _prewarm_then_run_dit(tmp_path, name, training, ATTENTION_ONLY_DIT_MODELS)
    problems = [k["problem"] for k in stats["kernels"]]
    if training:
        assert any("_backward." in p for p in problems)
    else:
        assert "head_norm_rope" in stats["ops"] and any(p.startswith("rope.") for p in problems)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(DIT_MODELS))
def test_training_prewarm_serves_a_patched_diffusion_transformers_backward(tmp_path, name):
    """kiln prewarm --config --training serves a patched transformer's forward and backward
    with autograd (fine-tuning: the norms and kiln.rope alone, each with its backward kernels)
    with no compile."""
    stats = _prewarm_then_run_dit(tmp_path, name, training=True)
    assert any("_backward." in k["problem"] for k in stats["kernels"])
