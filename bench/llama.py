"""A Llama-3-8B-shaped decoder end to end: transformers' LlamaForCausalLM with Llama-3-8B's
widths (hidden 4096, MLP 14336, 32 query and 8 key/value heads, vocabulary 128256, RoPE
theta 500000) and fewer layers (--layers, default 4), random weights, bf16; or, with
--model qwen3, Qwen3ForCausalLM with Qwen3-8B's (hidden 4096, MLP 12288, 32 and 8 heads of
128, vocabulary 151936, RoPE theta 1000000, and an RMSNorm of each head of q and k before
RoPE, which kiln.patch runs with the rotation as one head_norm_rope); or, with --model
phi4-mini, Phi3ForCausalLM with Phi-4-mini's (hidden 3072, MLP 8192 from one packed gate_up
projection, 24 and 8 heads of 128 from one packed qkv projection, RoPE on the first 96 columns
of each head, vocabulary 200064, tied embeddings); or, with --model deepseek-v3,
DeepseekV3ForCausalLM with DeepSeek-V3's widths and only its dense layers (its first three are:
multi-head latent attention of 128 heads, q and kv through 1536- and 512-wide compressions,
each head's last 64 q/k columns rotated as de-interleaved pairs with one k head, a SwiGLU of
18432, vocabulary 129280); or, with --model qwen3-moe, Qwen3MoeForCausalLM with Qwen3-30B-A3B's
(hidden 2048, 128 experts of 768 with eight a token, run by transformers' default grouped_mm
experts implementation, 32 and 4 heads of 128 with Qwen3's q/k norms, vocabulary 151936); or,
with --model llama4, Llama4ForCausalLM with Llama-4-Scout's text widths (hidden 5120, 16 experts
of 8192 run over every token as batched matmuls, a shared expert, 40 and 8 heads of 128,
vocabulary 202048); or, with --model gpt-oss, GptOssForCausalLM with GPT-OSS-20B's widths (hidden
2880, 32 experts of 2880 with four a token gated by their clamped SwiGLU over interleaved pairs,
64 and 8 heads of 64 with attention sinks, so transformers' eager attention; prefill only); or,
with --model inkling2, Inkling2ForCausalLM with Inkling-2's text widths (hidden 4608, an fp32
residual stream whose RMSNorms take bf16 weights, 32 of its 384 experts of 2304 with eight a
token gated by their softcapped SwiGLU, which kiln leaves, 48 and 8 heads of 128 in sliding and
full layers, relative-position logits and no RoPE, vocabulary 201024; eager attention, prefill
only; --layers 6, its attention-residual block, by default).
Settings of eager +
kiln without one of the patch's fusions (--apart: the layers' residual add and norm as one
fused_add_rms_norm, the head norms and RoPE as one head_norm_rope, the packed gate_up
projection's activation as one swiglu, the attention's RoPE) time what each gives. Cases:
prefill of 2 x 2048 tokens (one forward over the prompt, logits of the last token, as
generate computes them), and one decode step at batch 1 and 32 after 2048 cached tokens
(a StaticCache, replayed from a CUDA graph). Four settings each: eager, eager + kiln
(kiln.patch), torch.compile, torch.compile + kiln (the patched model compiled). Per
setting: median time, speedup over its baseline, the first call's time (compile, JIT),
and the logits' relative error against the unpatched eager logits.

Usage: python bench/llama.py [--out DIR] [--model llama|qwen3|phi4-mini|deepseek-v3|qwen3-moe|llama4|gpt-oss|inkling2] [--quick] [--layers N] [--cases prefill,decode1,decode32]
       [--settings eager,compile,eager+kiln,compile+kiln] [--apart residual-norms,head-norms] [--device cuda|cpu]
       [--tiny]
Writes DIR/<model>-<date>-<device>.json and .md; prints the table last. --device cpu with
--tiny is a smoke run (no CUDA graphs there); the CI tests build the same pieces."""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                 tie_word_embeddings=False)
TINY = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False)
QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
                max_position_embeddings=8192, tie_word_embeddings=False)
PHI4_MINI = dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=24, num_key_value_heads=8,
                 vocab_size=200064, rope_theta=10000.0, partial_rotary_factor=0.75, rms_norm_eps=1e-5,
                 max_position_embeddings=8192, tie_word_embeddings=True, pad_token_id=199999)
# DeepSeek-V3's first layers, its dense ones (first_k_dense_replace 3 of 61): multi-head latent
# attention (q through a 1536-wide compression, k and v through 512, each head's last 64 of 192
# q/k columns rotated as de-interleaved pairs, one k head for them) and a SwiGLU of 18432.
DEEPSEEK_V3_DENSE = dict(hidden_size=7168, intermediate_size=18432, num_attention_heads=128, num_key_value_heads=128,
                         q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                         v_head_dim=128, vocab_size=129280, rope_theta=10000.0, rms_norm_eps=1e-6,
                         max_position_embeddings=8192, first_k_dense_replace=61, rope_interleave=True,
                         tie_word_embeddings=False)
# Qwen3-30B-A3B: 128 experts of 768, eight a token, run by transformers' default experts
# implementation (grouped_mm), q/k norms per head as Qwen3's.
QWEN3_30B_A3B = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                     num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     max_position_embeddings=8192, tie_word_embeddings=False)
# Llama-4-Scout's text layers: 16 experts of 8192 and a shared expert, one expert a token, where
# every expert runs every token (the router scales them) as two batched matmuls over one packed
# [16, 5120, 2 x 8192] gate_up; q/k L2-normalised per head; RoPE of adjacent pairs by complex
# frequencies (apply_rotary_emb).
LLAMA4_SCOUT = dict(hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=16,
                    num_experts_per_tok=1, interleave_moe_layer_step=1, num_attention_heads=40,
                    num_key_value_heads=8, head_dim=128, vocab_size=202048, rope_theta=500000.0, rms_norm_eps=1e-5,
                    use_qk_norm=True, attention_chunk_size=8192, max_position_embeddings=8192,
                    tie_word_embeddings=False)
# GPT-OSS-20B: 32 experts of 2880, four a token, gated by their own clamped SwiGLU over interleaved
# pairs (kiln.clamped_swiglu); attention sinks, so transformers' eager attention (no SDPA).
GPT_OSS_20B = dict(hidden_size=2880, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4,
                   num_attention_heads=64, num_key_value_heads=8, head_dim=64, vocab_size=201088,
                   rope_theta=150000.0, rms_norm_eps=1e-5, sliding_window=128, max_position_embeddings=8192,
                   tie_word_embeddings=False)
# Inkling-2's language model: a hybrid of sliding-window and full attention layers (with short
# convolutions, relative-position logits, no RoPE), its residual stream in fp32 between
# attention-residual blocks of 6 layers, every MLP its experts (32 of its 384 here: a token's
# eight cost the same), their gate softcapped.
INKLING2 = dict(hidden_size=4608, moe_intermediate_size=2304, n_routed_experts=32, num_experts_per_tok=8,
                num_attention_heads=48, num_key_value_heads=8, head_dim=128, swa_num_attention_heads=48,
                swa_num_key_value_heads=8, swa_head_dim=128, vocab_size=201024, unpadded_vocab_size=200058,
                rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=200006)
MODELS = {"llama": ("LlamaConfig", LLAMA3_8B, "Llama-3-8B"), "qwen3": ("Qwen3Config", QWEN3_8B, "Qwen3-8B"),
          "phi4-mini": ("Phi3Config", PHI4_MINI, "Phi-4-mini"),
          "deepseek-v3": ("DeepseekV3Config", DEEPSEEK_V3_DENSE, "DeepSeek-V3 (dense layers)"),
          "qwen3-moe": ("Qwen3MoeConfig", QWEN3_30B_A3B, "Qwen3-30B-A3B"),
          "llama4": ("Llama4TextConfig", LLAMA4_SCOUT, "Llama-4-Scout"),
          "gpt-oss": ("GptOssConfig", GPT_OSS_20B, "GPT-OSS-20B"),
          "inkling2": ("Inkling2TextConfig", INKLING2, "Inkling-2")}
# Attention implementations other than SDPA, for models that do not support it.
ATTENTION = {"gpt-oss": "eager", "inkling2": "eager"}
# The tiny config's widths as each model's family needs them.
TINY_EXTRA = {"qwen3": dict(head_dim=16), "phi4-mini": dict(partial_rotary_factor=0.75, pad_token_id=0),
              "deepseek-v3": dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8,
                                  qk_nope_head_dim=16, v_head_dim=16, first_k_dense_replace=100,
                                  rope_interleave=True),
              "qwen3-moe": dict(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
              "llama4": dict(head_dim=16, intermediate_size=32, intermediate_size_mlp=96, num_local_experts=4,
                             num_experts_per_tok=1, interleave_moe_layer_step=1, use_qk_norm=True),
              "gpt-oss": dict(head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
              "inkling2": dict(head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
                               moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                               unpadded_vocab_size=128, d_rel=8, eos_token_id=2)}
# Models whose decode step this bench does not time, and why.
PREFILL_ONLY = {"llama4": "Llama 4's cache layers for chunked attention are not reset to a fixed past by "
                          "decode_state, so repeated steps would not repeat one step",
                "gpt-oss": "GPT-OSS's sliding-window cache layers roll their window at each step and count "
                           "tokens in a Python int, which decode_state does not rewind, so repeated steps "
                           "would not repeat one step",
                "inkling2": "Inkling 2's layers keep short-convolution states in the cache beside keys and "
                            "values, which decode_state does not rewind"}
# Layers where the default (4) would cut a model's structure short: Inkling 2's attention
# residuals come in blocks of 6.
DEFAULT_LAYERS = {"inkling2": 6}
PREFILL = (2, 2048)  # batch, tokens
PAST = 2048  # tokens in the cache before the decode step
CASES = ["prefill", "decode1", "decode32"]


def llama_config(layers=4, tiny=False, model="llama"):
    import transformers

    config_class, widths, _ = MODELS[model]
    tiny_widths = dict(TINY, **TINY_EXTRA.get(model, {}))
    return getattr(transformers, config_class)(**(tiny_widths if tiny else widths), num_hidden_layers=layers)


def head_norms_apart(kiln):
    """kiln.patch with each attention's q/k norms and rotation left as separate ops (the
    patch before they were fused into one head_norm_rope)."""
    from kiln.patching import head_norm_attention

    def patch(model):
        fuse = head_norm_attention.fuse
        head_norm_attention.fuse = lambda module, match: match
        try:
            return kiln.patch(model)
        finally:
            head_norm_attention.fuse = fuse
    return patch


def candidates_apart(kiln, pattern, test="candidate"):
    """kiln.patch with the modules of one of kiln.patching's patterns (its module's
    ``candidate``, or the test named ``test``) left as they are."""
    import importlib

    found = importlib.import_module(f"kiln.patching.{pattern}")

    def patch(model):
        candidate = getattr(found, test)
        setattr(found, test, lambda module: False)
        try:
            return kiln.patch(model)
        finally:
            setattr(found, test, candidate)
    return patch


def residual_norms_apart(kiln):
    """kiln.patch with each decoder layer's residual add and the norm after it left as
    separate ops (the add in torch, the norm as kiln.rms_norm: the patch before the layers'
    forwards were rewritten for one fused_add_rms_norm)."""
    return candidates_apart(kiln, "residual_norm_layer")


def packed_gates_apart(kiln):
    """kiln.patch with packed gate_up MLPs left to torch (chunk, activation and multiply)."""
    return candidates_apart(kiln, "packed_gate")


def rope_apart(kiln):
    """kiln.patch with the attentions' RoPE left to transformers' formula."""
    return candidates_apart(kiln, "rope_attention")


def gated_mlps_apart(kiln):
    """kiln.patch with gated MLPs of two projections (Llama's act_fn(gate_proj(x)) * up_proj(x))
    left to torch."""
    return candidates_apart(kiln, "detect", "mlp_candidate")


def bmm_experts_apart(kiln):
    """kiln.patch with Llama 4's experts (batched matmuls over one packed gate_up) left to
    transformers."""
    return candidates_apart(kiln, "bmm_experts")


def experts_apart(kiln):
    """kiln.patch with the MoE experts' gate left to transformers (chunk, activation, multiply)."""
    return candidates_apart(kiln, "experts_gate")


# What a fifth setting leaves out of kiln's patch, by name (bench/llama.py --apart).
APART = {"head-norms": ("eager+kiln, head norms apart", head_norms_apart),
         "residual-norms": ("eager+kiln, residual norms apart", residual_norms_apart),
         "packed-gates": ("eager+kiln, packed gates apart", packed_gates_apart),
         "rope": ("eager+kiln, rope apart", rope_apart),
         "gated-mlps": ("eager+kiln, gated MLPs apart", gated_mlps_apart),
         "bmm-experts": ("eager+kiln, experts apart", bmm_experts_apart),
         "experts": ("eager+kiln, experts apart", experts_apart)}
# What each model's run sets apart where --apart is not given.
DEFAULT_APART = {"llama": ["residual-norms"], "qwen3": ["residual-norms", "head-norms"],
                 "phi4-mini": ["residual-norms", "packed-gates", "rope"], "deepseek-v3": ["residual-norms", "rope"],
                 "qwen3-moe": ["experts"], "llama4": ["bmm-experts", "rope"], "gpt-oss": ["experts"], "inkling2": []}


def build_model(config, device="cuda", dtype=torch.bfloat16, seed=0, attention="sdpa"):
    """LlamaForCausalLM with transformers' own random init (normal, std 0.02) made on
    `device` in `dtype`; the norm weights, which start at one, get a random spread so the
    weight matters."""
    import transformers

    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
        # Routers that run in fp32 whatever the model's dtype (Inkling 2's), as checkpoints keep them.
        for module in model.modules():
            if type(module).__name__ == "Inkling2TopKRouter":
                module.float()
    return model.eval()


def prefill_inputs(config, batch, tokens, device="cuda", seed=1):
    """A prompt of random token ids; only the last position's logits (logits_to_keep=1),
    and no cache kept (the forward over the prompt is what is timed)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, tokens), generator=g).to(device)
    return dict(input_ids=ids, use_cache=False, logits_to_keep=1)


def decode_state(model, batch, past, device="cuda", seed=2):
    """A StaticCache holding `past` tokens (a prompt of random ids run through the
    unpatched model) and the inputs of the next token's step, all at fixed addresses so the
    step can be captured in a CUDA graph: the token, its position, and the 4-D attention
    mask over the cache (every slot valid; transformers takes a 4-D mask as given). The
    cache layers count the tokens written in a tensor that each step advances: `step`
    rewinds it first, so every replay writes the same slot and sees the same cache."""
    import transformers

    config = model.config
    g = torch.Generator(device="cpu").manual_seed(seed)
    cache = transformers.StaticCache(config=config, max_cache_len=past + 1)
    prompt = torch.randint(0, config.vocab_size, (batch, past), generator=g).to(device)
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    inputs = dict(
        input_ids=torch.randint(0, config.vocab_size, (batch, 1), generator=g).to(device),
        position_ids=torch.full((batch, 1), past, dtype=torch.long, device=device),
        attention_mask=torch.ones(batch, 1, 1, past + 1, dtype=torch.bool, device=device),
        past_key_values=cache, use_cache=True)

    def step(fn):
        for layer in cache.layers:
            layer.cumulative_length.fill_(past)
        return fn(**inputs).logits

    return cache, inputs, step


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--model", default="llama", choices=sorted(MODELS))
    parser.add_argument("--quick", action="store_true", help="2 layers, prefill and decode at batch 32, fewer reps")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 4; Llama-3-8B has 32)")
    parser.add_argument("--cases", default=None, help=f"comma-separated among {CASES} (decodeN: batch N)")
    parser.add_argument("--settings", default=",".join(common.SETTINGS))
    parser.add_argument("--past", type=int, default=PAST, help="cached tokens before the decode step")
    parser.add_argument("--prefill", default="x".join(map(str, PREFILL)), help="batch x tokens of the prefill")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="the tiny config of the CI tests")
    parser.add_argument("--tag", default="", help="appended to the output file names")
    parser.add_argument("--apart", default=None,
                        help=f"comma-separated among {sorted(APART)}: eager + kiln without that fusion, as a "
                             "setting of its own (default: residual-norms, and head-norms for qwen3, packed-gates "
                             "and rope for phi4-mini)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    kiln = common.fresh_kiln(1024)
    layers = args.layers if args.layers is not None else DEFAULT_LAYERS.get(args.model, 2 if args.quick else 4)
    cases = args.cases.split(",") if args.cases else (["prefill", "decode32"] if args.quick else CASES)
    settings = common.model_settings(args.settings, "llama")
    bad = [c for c in cases if c != "prefill" and not (c.startswith("decode") and c[6:].isdigit())]
    if bad:
        raise SystemExit(f"llama: --cases: expected prefill or decodeN, got {bad}")
    if args.model in PREFILL_ONLY and cases != ["prefill"]:
        if args.cases:
            raise SystemExit(f"llama: --model {args.model}: only the prefill case ({PREFILL_ONLY[args.model]})")
        cases = ["prefill"]
    prefill_batch, prefill_tokens = (int(v) for v in args.prefill.split("x"))
    graphs = args.device == "cuda"
    reps = args.reps or (3 if args.quick else 10)
    warmup = 1 if args.quick else 2

    env = common.model_environment(args.device)
    started = time.perf_counter()
    config = llama_config(layers, args.tiny, args.model)
    model = build_model(config, args.device, attention=ATTENTION.get(args.model, "sdpa"))
    apart = args.apart.split(",") if args.apart is not None else DEFAULT_APART[args.model]
    unknown = sorted(set(a for a in apart if a) - set(APART))
    if unknown:
        raise SystemExit(f"llama: --apart: expected names among {sorted(APART)}, got {unknown}")
    variants = {APART[a][0]: APART[a][1](kiln) for a in apart if a} or None
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"{MODELS[args.model][2]}-shaped decoder: {layers} layers, {billions:.2f}B "
          f"parameters, built in {time.perf_counter() - started:.1f} s", flush=True)

    results = []
    for case in cases:
        if case == "prefill":
            inputs = prefill_inputs(config, prefill_batch, prefill_tokens, args.device)
            print(f"prefill {prefill_batch}x{prefill_tokens}", flush=True)
            records, report = common.run_model_settings(model, lambda fn: fn(**inputs).logits, kiln,
                                                        settings=settings, warmup=warmup, reps=reps,
                                                        variants=variants)
            shape = {"batch": prefill_batch, "tokens": prefill_tokens, "cuda_graphs": False}
        else:
            batch = int(case[6:])
            cache, inputs, step = decode_state(model, batch, args.past, args.device)
            print(f"decode batch {batch}, {args.past} cached tokens, CUDA graphs: {graphs}", flush=True)
            # Decode steps take a millisecond or two: more of them for a steady median.
            records, report = common.run_model_settings(model, step, kiln, settings=settings, warmup=warmup,
                                                        reps=reps * 5, graphs=graphs, variants=variants)
            shape = {"batch": batch, "tokens": 1, "past": args.past, "cuda_graphs": graphs}
            del cache, step
        results.append({"case": case, **shape, "settings": records, "patch": common.patch_summary(report)})
        write(args, env, config, results, final=False)
    table = write(args, env, config, results, final=True)
    print(f"total {time.perf_counter() - started:.0f} s")
    print(table)
    return results


def write(args, env, config, results, final):
    import kiln

    document = {"environment": env, "config": config.to_dict(), "dtype": "bf16", "quick": args.quick,
                "cases": results,
                "errors": "max_rel = max|out - eager| / max|eager|, mean_rel = mean|out - eager| / mean|eager|, "
                          "of the logits, against the unpatched eager logits",
                "kiln_settings": kiln.settings()}
    name = f"{args.model}-{common.stamp(env)}{args.tag}" if final else f"{args.model}-partial{args.tag}"
    common.write_json(os.path.join(args.out, name + ".json"), document)
    if not final:
        return None
    table = markdown(env, config, results, MODELS[args.model][2])
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(table + "\n")
    return table


def markdown(env, config, results, name="Llama-3-8B"):
    versions = env["versions"]
    lines = [
        f"{name}-shaped decoder ({config.num_hidden_layers} layers), bf16, {env['device']} ({env['sm']}), "
        f"{env['date']}, torch {versions['torch']}, transformers {versions.get('transformers', '-')}; random weights. "
        "ms = median per forward (decode: one token, replayed from a CUDA graph), each timed alone after at "
        "least 1 s of warm-up calls; host ms = median time the host takes to issue one (a graph replay: the "
        "replay call); speedup of eager+kiln over eager "
        "and of compile+kiln over compile; errors of the logits against the unpatched eager logits "
        "(max|d| / max|ref|, mean|d| / mean|ref|); first call = torch.compile's compile or kiln's JIT and tuning.",
        "",
        "| case | shape | setting | ms | host ms | speedup | max rel err | mean rel err | first call s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        shape = (f"{r['batch']}x{r['tokens']}" if r["case"] == "prefill"
                 else f"batch {r['batch']}, {r['past']} past" + (", graphs" if r["cuda_graphs"] else ""))
        for name, s in r["settings"].items():
            err = s.get("error_vs_eager")
            speedup = f"{s['speedup']:.2f}x vs {s['speedup_vs']}" if "speedup" in s else "-"
            errs = f"{err['max_rel']:.2e} | {err['mean_rel']:.2e}" if err else "- | -"
            label = name if s["cuda_graph"] or not r["cuda_graphs"] else f"{name} (capture failed: no graph)"
            lines.append(f"| {r['case']} | {shape} | {label} | {s['ms']:.3f} | {common.host_cell(s)} | {speedup} | "
                         f"{errs} | {s['first_call_s']:.1f} |")
    lines.append("")
    for r in results:
        if r["patch"]:
            lines.append(f"kiln.patch ({r['case']}): replaced {r['patch']['replaced']}, left {r['patch']['left']}")
    return "\n".join(lines).rstrip()


if __name__ == "__main__":
    main()
