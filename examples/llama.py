"""kiln on a Llama model: patch it, generate greedily, and compare with the unpatched model.

    python examples/llama.py /path/to/llama-checkpoint   # a local transformers checkpoint
    python examples/llama.py                             # random weights, a small config
    python examples/llama.py --tiny                      # random weights, a tiny config

With a checkpoint the prompt goes through its tokenizer (random token ids where the
checkpoint has none, and with random weights). Runs on the GPU where there is one (bf16),
else on the CPU (fp32, kiln's CPU implementations). Prints kiln.patch's report, the greedy tokens of both models and how
far the patched model's prompt logits are from the unpatched model's.
"""

import argparse
import os
import sys
import time

import torch
import transformers

import kiln

SMALL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=32000, rope_theta=500000.0, rms_norm_eps=1e-5)
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, rope_theta=500000.0, rms_norm_eps=1e-5)


def load(args, device, dtype):
    """The model and a prompt of token ids."""
    if args.checkpoint:
        if not os.path.isdir(args.checkpoint):
            raise SystemExit(f"llama example: checkpoint: expected a local directory, got {args.checkpoint!r}")
        model = transformers.AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=dtype,
                                                                  local_files_only=True).to(device)
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(args.checkpoint, local_files_only=True)
        except (OSError, ValueError):  # a checkpoint saved without its tokenizer
            tokenizer = None
        if tokenizer is not None:
            ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(device)
            return model.eval(), ids, tokenizer
        return model.eval(), random_prompt(model.config, args.prompt_tokens, device), None
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**(TINY if args.tiny else SMALL))
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype)
        with torch.no_grad():  # norm weights start at one: give them a spread so they matter
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
    return model.eval(), random_prompt(config, args.prompt_tokens, device), None


def random_prompt(config, tokens, device):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, config.vocab_size, (1, tokens), generator=g).to(device)


def run(model, ids, new_tokens):
    """The prompt's logits and the greedy continuation, and the seconds they took."""
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(ids).logits
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)[:, ids.shape[1]:]
    if ids.is_cuda:
        torch.cuda.synchronize()
    return logits, tokens, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", nargs="?", help="a local transformers checkpoint directory")
    parser.add_argument("--tiny", action="store_true", help="random weights, a tiny config (no checkpoint)")
    parser.add_argument("--prompt", default="The kiln fired the clay at", help="with a checkpoint")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="random prompt length (no checkpoint)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    model, ids, tokenizer = load(args, device, dtype)
    print(f"model: {type(model).__name__}, {model.config.num_hidden_layers} layers, hidden "
          f"{model.config.hidden_size}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{dtype} on {device}; prompt of {ids.shape[1]} tokens")

    run(model, ids, 1)  # both timings are of a later call
    ref_logits, ref_tokens, ref_s = run(model, ids, args.new_tokens)
    report = kiln.patch(model)
    print(report)
    run(model, ids, 1)  # the first call compiles and tunes kiln's kernels for these shapes
    logits, tokens, kiln_s = run(model, ids, args.new_tokens)
    restored = kiln.unpatch(model)

    diff = (logits.double() - ref_logits.double()).abs()
    max_rel = (diff.max() / ref_logits.double().abs().max()).item()
    mean_rel = (diff.mean() / ref_logits.double().abs().mean()).item()
    same = int((tokens == ref_tokens).sum())
    show = (lambda t: repr(tokenizer.decode(t[0]))) if tokenizer else (lambda t: t[0].tolist())  # noqa: E731
    print(f"unpatched greedy tokens: {show(ref_tokens)} ({ref_s:.2f} s)")
    print(f"kiln      greedy tokens: {show(tokens)} ({kiln_s:.2f} s)")
    print(f"comparison: {same}/{tokens.numel()} greedy tokens equal; prompt logits max rel err {max_rel:.2e}, "
          f"mean rel err {mean_rel:.2e} (max|d| / max|ref|, mean|d| / mean|ref|)")
    print(f"kiln.unpatch: {restored} modules restored")
    return 0 if torch.isfinite(logits).all() else 1


if __name__ == "__main__":
    sys.exit(main())
