"""RoPE on [B, H, S, D] data (transformers' layout, a head's positions contiguous), which the
kernel walks positions-inner: panels of consecutive positions of one head, a thread's rows
the same token in consecutive heads. A full tune checks every candidate against the
heuristic's output on its stand-alone run, laid out the same way; then every measured
candidate is pinned in turn and op calls on shapes whose last panel is partial (odd
sequence lengths, batch > 1, q and k with different head counts) are compared with fp64.

The same for [B, H, S, D] views of [B, S, H, D] data (what transformers' attention hands
RoPE after its transpose), walked heads-inner. Either way a thread whose rows are one
token's consecutive heads of q, or of k, derives their places from its first row's; the
head counts 5 + 3 give every config with several rows a thread some threads whose rows
cross from q to k or into the next token, which take the general path.

Head counts that divide by 2 or 4 (4 + 4, 8 + 4, 6 + 2) make the configs of as many rows a
thread grouped: each thread's rows one token's heads of one tensor, placed once. Their
problems are tuned and pinned the same way, 6 + 2 also through the general form for 4 rows
a thread.

q and k of one head each (LTX-Video's [B, S, H * D] rows rotated whole, and a [B, 1, S, D]
head walked positions-inner) make the configs of 2 rows a thread token pairs: a thread's
rows one token's q row and k row."""

import pytest

from pinned_tune import run_child

pytestmark = pytest.mark.gpu

CHILD = r"""
import pathlib
import sys
import torch
import kiln
from pinned_tune import check_every_pinned_config
from reference import assert_close_to
from rope_reference import (diffusers_apply_rotary_emb, hf_apply_rotary_pos_emb, llama_cos_sin,
                            ltx_apply_rotary_emb, transformers_qk)

cache = pathlib.Path(sys.argv[1])
gen = torch.Generator(device="cuda").manual_seed(5)

def poison():
    torch.cuda.synchronize()
    junk = torch.full((4 << 20,), float("nan"), device="cuda")
    del junk

def half_split(heads_inner, heads_q=5, heads_k=3):
    # 2 x 33 tokens x (5 + 3) heads: the last panel of each config is partial. Heads inner:
    # [2, 5, 33, 64] and [2, 3, 33, 64] views of [B, S, H, D] data, heads contiguous.
    q, k = transformers_qk(2, heads_q, heads_k, 33, 64, torch.bfloat16, heads_inner, generator=gen)
    cos, sin = llama_cos_sin(2, 33, 64, positions=torch.randint(0, 4096, (2, 33)))
    cos, sin = cos.cuda().bfloat16(), sin.cuda().bfloat16()
    q_ref, k_ref = hf_apply_rotary_pos_emb(q, k, cos, sin)
    def check():
        poison()
        q_out, k_out = kiln.rope(q, k, cos, sin)
        assert_close_to(q_out, q_ref, torch.bfloat16)
        assert_close_to(k_out, k_ref, torch.bfloat16)
    return check

def interleaved():
    # fp16 data, an fp32 table shared by the 3 batch entries, 4 + 4 heads of 128, 21 positions.
    q = torch.randn(3, 4, 21, 128, device="cuda", generator=gen).half()
    k = torch.randn(3, 4, 21, 128, device="cuda", generator=gen).half()
    cos = torch.randn(21, 128, device="cuda", generator=gen)
    sin = torch.randn(21, 128, device="cuda", generator=gen)
    q_ref, k_ref = diffusers_apply_rotary_emb(q, cos, sin), diffusers_apply_rotary_emb(k, cos, sin)
    def check():
        poison()
        q_out, k_out = kiln.rope(q, k, cos, sin, interleaved=True)
        assert_close_to(q_out, q_ref, torch.float16)
        assert_close_to(k_out, k_ref, torch.float16)
    return check

def one_head_each():
    # LTX-Video's layout: q, k [B, S, C] rotated over all C in interleaved pairs, an fp32
    # table per batch entry, 2 x 37 tokens (the last of each config's CTAs partial).
    q = torch.randn(2, 37, 384, device="cuda", generator=gen).bfloat16()
    k = torch.randn(2, 37, 384, device="cuda", generator=gen).bfloat16()
    cos = torch.randn(2, 37, 384, device="cuda", generator=gen)
    sin = torch.randn(2, 37, 384, device="cuda", generator=gen)
    q_ref, k_ref = ltx_apply_rotary_emb(q, cos, sin), ltx_apply_rotary_emb(k, cos, sin)
    def check():
        poison()
        q_out, k_out = kiln.rope(q, k, cos, sin, interleaved=True, layout="bshd")
        assert_close_to(q_out, q_ref, torch.bfloat16)
        assert_close_to(k_out, k_ref, torch.bfloat16)
    return check

# By the problem's flags: 8 = positions inner (+ 1 interleaved + 2 fp32 table); 0 = heads
# inner, half-split, table in the data's dtype; 16 = both head counts even, + 32 = both
# multiples of 4; 64 = one head each.
checks = {"f8": half_split(False), "f59": interleaved(), "f0": half_split(True),
          "f48": half_split(True, 8, 4), "f24": half_split(False, 6, 2),
          "f67": one_head_each(), "f72": half_split(False, 1, 1)}
for check in checks.values():
    check()  # tunes its problem in full, every candidate checked by the tuner
print("ok", check_every_pinned_config(cache, checks))
"""


def test_every_config_of_both_row_walks_is_correct(tmp_path):
    run_child(CHILD, [str(tmp_path)], tmp_path, "full")
