"""RoPE on q and k as transformers' attentions hand them to apply_rotary_pos_emb ([B, S, H, D]
memory viewed as [B, H, S, D]), timed side by side:
- Llama-style calls (a [1, S, D] table whose halves repeat each angle): kiln out of place, kiln
  reading the table's first half (`cos[..., :D // 2]`, rotary_dim=D), kiln in place, Liger-Kernel's
  in-place rotation, and the plainest kernels of q's and k's bytes out of place and in place
  (`torch.neg`), which say what writing elsewhere costs any streaming kernel under this timing;
- GPT-OSS calls ([B, S, D / 2] tables, each angle once): kiln, Liger (rotary_dim=D), the eager
  formula of transformers' GPT-OSS and torch.compile of it.
With --profile, one launch of each between cudaProfilerStart and Stop, for `ncu`.

Usage (GPU machine):
  python bench/diagnostics/rope_bshd.py                  # side-by-side times, a markdown table
  python bench/diagnostics/rope_bshd.py --profile        # warm the cache, then one launch each
  ncu --profile-from-start off --clock-control none --cache-control all \\
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
      python bench/diagnostics/rope_bshd.py --profile"""

import os
import sys
from importlib.metadata import version

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import libraries  # noqa: E402
import rope as rope_bench  # noqa: E402

LLAMA = [(1, 32, 8, 4096, 128), (8, 32, 8, 2048, 128), (1, 28, 4, 4096, 128)]
GPT_OSS = [(1, 64, 8, 4096, 64), (64, 64, 8, 1, 64)]


def gpt_oss_table(batch, seq, dim):
    inv_freq = 1.0 / (150000.0 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))
    angles = torch.arange(seq, device="cuda").float().expand(batch, seq)[..., None] * inv_freq
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def gpt_oss_eager(q, k, cos, sin):
    """transformers' GPT-OSS apply_rotary_pos_emb."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate(x):
        first, second = torch.chunk(x, 2, dim=-1)
        return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

    return rotate(q), rotate(k)


def qk(shape):
    b, hq, hk, s, d = shape
    return (libraries.rand(b, s, hq, d).transpose(1, 2), libraries.rand(b, s, hk, d).transpose(1, 2))


def llama_contenders(kiln, shape):
    q, k = qk(shape)
    d = shape[-1]
    cos, sin = rope_bench.llama_table(1, shape[3], d)
    moved = 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * 2
    # In-place contenders rotate copies of their own again and again: the same bytes move.
    mine, theirs = (q.clone(), k.clone()), (q.clone(), k.clone())
    half_cos, half_sin = cos[..., :d // 2], sin[..., :d // 2]
    calls = {
        "kiln": lambda: kiln.rope(q, k, cos, sin),
        "kiln_half_table": lambda: kiln.rope(q, k, half_cos, half_sin, rotary_dim=d),
        "kiln_inplace": lambda: kiln.rope_(*mine, cos, sin),
    }
    if libraries.LIGER is not None:
        calls["liger_inplace"] = lambda: libraries.LIGER["rope"](*theirs, cos, sin)
    flat = torch.cat([q.flatten(), k.flatten()])
    out, own = torch.empty_like(flat), flat.clone()
    calls["neg"] = lambda: torch.neg(flat, out=out)
    calls["neg_inplace"] = lambda: own.neg_()
    check = (kiln.rope(q, k, half_cos, half_sin, rotary_dim=d)[0], kiln.rope(q, k, cos, sin)[0])
    return calls, moved, check


def gpt_oss_contenders(kiln, shape):
    q, k = qk(shape)
    d = shape[-1]
    cos, sin = gpt_oss_table(shape[0], shape[3], d)
    moved = 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * 2
    compiled = torch.compile(gpt_oss_eager, dynamic=False)
    theirs = (q.clone(), k.clone())
    calls = {
        "kiln": lambda: kiln.rope(q, k, cos, sin, rotary_dim=d),
        "eager": lambda: gpt_oss_eager(q, k, cos, sin),
        "compiled": lambda: compiled(q, k, cos, sin),
    }
    if libraries.LIGER is not None:
        from liger_kernel.ops.rope import LigerRopeFunction

        calls["liger_inplace"] = lambda: LigerRopeFunction.apply(*theirs, cos, sin, None, 1, d)
    check = (kiln.rope(q, k, cos, sin, rotary_dim=d)[0], gpt_oss_eager(q, k, cos, sin)[0])
    return calls, moved, check


def cases(kiln):
    for shape in LLAMA:
        yield "llama", shape, llama_contenders(kiln, shape)
    for shape in GPT_OSS:
        yield "gpt-oss", shape, gpt_oss_contenders(kiln, shape)


def main():
    profile = "--profile" in sys.argv
    kiln = __import__("kiln") if profile else common.fresh_kiln()
    rows = []
    for kind, shape, (calls, moved, (got, expected)) in cases(kiln):
        for call in calls.values():
            call()
        torch.cuda.synchronize()
        label = "{0} q[{1},{2},{4},{5}] k[{1},{3},{4},{5}]".format(kind, *shape)
        if profile:
            torch.cuda.profiler.start()
            for name, call in calls.items():
                torch.cuda.nvtx.range_push(f"{label} {name}")
                call()
                torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            continue
        error = ((got.double() - expected.double()).norm() / expected.double().norm()).item()
        calls["copy"] = common.same_bytes_copy(moved)
        times = common.bench_side_by_side(calls)
        for name, t in times.items():
            rows.append((label, f"{moved / 1e6:.1f}", name, t * 1e3, t / times["copy"], error))
        print(label, ", ".join(f"{n} {t * 1e3:.2f} us" for n, t in times.items()), flush=True)
    if profile:
        return
    env = common.environment()
    liger = version("liger-kernel") if libraries.LIGER is not None else "absent"
    print(f"\n{env['device']}, {env['date']}, {env['versions']}, liger-kernel {liger}\n")
    print("| call | MB (full table) | contender | us | x copy's time | kiln's rel. diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, mb, name, us, ratio, error in rows:
        print(f"| {label} | {mb} | {name} | {us:.2f} | {ratio:.3f} | {error:.1e} |")
    print(kiln.report(format="md", op="rope"))


if __name__ == "__main__":
    main()
