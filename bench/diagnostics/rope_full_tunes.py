"""Full tunes (every config timed by the tuner) of kiln.rope on heads whose half is not a power
of two of 16-byte vectors: the vision towers' heads of 80 (Qwen2/2.5-VL) and 72 (Qwen3-VL),
Phi-3-mini's heads of 96 and Phi-4-mini's rotary dim of 96 of 128, prefill and decode, with a
128-wide Llama prefill beside them. Prints each tune's verdict and its fastest configs, and
copies the tune records (every config's time) to --out for reading a heuristic against them.

Usage: python bench/diagnostics/rope_full_tunes.py [--out DIR] [--top 6]"""

import argparse
import json
import os
import shutil
import sys

os.environ["KILN_TUNE"] = "full"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import common  # noqa: E402

BF16 = torch.bfloat16


def vision(patches, head_dim, heads=16):
    """q, k as the towers unbind them from one [S, 3, H, D] projection, as [1, S, H, D]; fp32 table."""
    qkv = torch.randn(patches, 3, heads, head_dim, device="cuda", dtype=BF16)
    angles = torch.rand(patches, head_dim // 2, device="cuda") * 60.0
    emb = torch.cat((angles, angles), -1)
    return lambda kiln: kiln.rope(qkv[:, 0].unsqueeze(0), qkv[:, 1].unsqueeze(0), emb.cos(), emb.sin(),
                                  layout="bshd")


def decoder(seq, heads_q, heads_k, head_dim, rotary_dim):
    """q, k [1, H, S, D] views of [1, S, H, D] projections (transformers'); a bf16 table [1, S, R]."""
    q = torch.randn(1, seq, heads_q, head_dim, device="cuda", dtype=BF16).transpose(1, 2)
    k = torch.randn(1, seq, heads_k, head_dim, device="cuda", dtype=BF16).transpose(1, 2)
    angles = torch.rand(1, seq, rotary_dim // 2, device="cuda") * 60.0
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().to(BF16), emb.sin().to(BF16)
    return lambda kiln: kiln.rope(q, k, cos, sin, rotary_dim=rotary_dim)


CASES = {"vision 80, 5184 patches": vision(5184, 80), "vision 80, 1024 patches": vision(1024, 80),
         "vision 72, 4096 patches": vision(4096, 72),
         "Phi-3-mini prefill 4096": decoder(4096, 32, 32, 96, 96), "Phi-3-mini decode": decoder(1, 32, 32, 96, 96),
         "Phi-4-mini prefill 4096 (96 of 128)": decoder(4096, 24, 8, 128, 96),
         "Llama prefill 4096 (128)": decoder(4096, 32, 8, 128, 128)}


def key(config):
    return f"v{config['vec_bytes']}.t{config['threads_per_row']}.c{config['cta_threads']}" + "".join(
        f".{k}={v}" for k, v in sorted(config.get("extra", {}).items()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/latest")
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args()
    kiln = common.fresh_kiln()
    tunes, seen = common.tune_dir(kiln), set()
    os.makedirs(args.out, exist_ok=True)
    with torch.no_grad():
        for name, call in CASES.items():
            call(kiln)
            torch.cuda.synchronize()
            for file, reason in common.tuned_configs(tunes, seen).items():
                record = json.load(open(os.path.join(tunes, file)))
                shutil.copy(os.path.join(tunes, file), os.path.join(args.out, f"rope-full-tune-{file}"))
                ok = sorted((t for t in record["trials"] if t["status"] == "ok"), key=lambda t: t["median_us"])
                print(f"{name} ({file}): {reason}")
                print("   " + ", ".join(f"{key(t['config'])} {t['median_us']:.2f}" for t in ok[:args.top]))


if __name__ == "__main__":
    main()
