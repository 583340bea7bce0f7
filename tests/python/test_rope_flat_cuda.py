"""kiln.rope_flat, the RoPE kernel for heads whose half is not whole 16-byte vectors (it reads
and writes whole vectors of the row and takes each element's partner from the row's bytes in
L1): a full tune measures it beside kiln::rope (every candidate checked by the tuner against
the heuristic's output), then each flat config measured is pinned in turn and op calls are
compared with fp64, outputs poisoned first, in place too. The cases: Qwen3-VL's 72-wide heads
(q and k strided views of one qkv projection, an fp32 table), MiniMax-M3-VL's 78 rotated of 80
(a bf16 table of 4-byte aligned rows, the data 16-byte aligned), and the backward (the
transposed rotation) of 72-wide fp16 heads in transformers' [B, H, S, D] layout from a half
table. The tables' columns are drawn independently, so a kernel that reads a wrong column (a
partner's angle for its own) is caught."""

import pytest

from pinned_tune import run_child

pytestmark = pytest.mark.gpu

CHILD = r"""
import json
import pathlib
import sys
import torch
import kiln
from pinned_tune import config_key
from reference import assert_close_to

cache = pathlib.Path(sys.argv[1])
gen = torch.Generator(device="cuda").manual_seed(7)

def poison():
    torch.cuda.synchronize()
    junk = torch.full((4 << 20,), float("nan"), device="cuda")
    del junk

def table(rows, width, dtype):
    angles = 2 * torch.pi * torch.rand(2, rows, width, device="cuda", generator=gen)
    return angles[0].cos().to(dtype), angles[1].sin().to(dtype)

def rotate(x, cos, sin, inverse=False):
    # rope.cuh's map over the first R = cos.shape[-1] columns in fp64; cos, sin broadcast
    # against x [..., D]. The inverse is its transpose (each element's sin at its partner).
    x, cos, sin = x.double(), cos.double(), sin.double()
    r = cos.shape[-1]
    h = r // 2
    a, b, rest = x[..., :h], x[..., h:r], x[..., r:]
    if inverse:
        first = a * cos[..., :h] + b * sin[..., h:]
        second = b * cos[..., h:] - a * sin[..., :h]
    else:
        first = a * cos[..., :h] - b * sin[..., :h]
        second = b * cos[..., h:] + a * sin[..., h:]
    return torch.cat([first, second, rest], -1)

def qwen3_vl():
    # 37 patches x (4 + 4) heads of 72 bf16, strided views of one [S, 3, H, 72] projection.
    qkv = torch.randn(1, 37, 3, 4, 72, device="cuda", generator=gen).bfloat16()
    q, k = qkv[:, :, 0], qkv[:, :, 1]
    cos, sin = table(37, 72, torch.float32)
    q_ref, k_ref = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
    def check():
        poison()
        q_out, k_out = kiln.rope(q, k, cos, sin, layout="bshd")
        assert_close_to(q_out, q_ref, torch.bfloat16)
        assert_close_to(k_out, k_ref, torch.bfloat16)
        again = qkv.clone()
        kiln.rope_(again[:, :, 0], again[:, :, 1], cos, sin, layout="bshd")
        assert torch.equal(again[:, :, 0], q_out) and torch.equal(again[:, :, 1], k_out)
        assert torch.equal(again[:, :, 2], qkv[:, :, 2])
    return check

def minimax():
    # 41 patches x (4 + 4) heads of 80 bf16, the first 78 rotated by a [S, 78] bf16 table.
    q = torch.randn(1, 41, 4, 80, device="cuda", generator=gen).bfloat16()
    k = torch.randn(1, 41, 4, 80, device="cuda", generator=gen).bfloat16()
    cos, sin = table(41, 78, torch.bfloat16)
    q_ref, k_ref = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
    def check():
        poison()
        q_out, k_out = kiln.rope(q, k, cos, sin, layout="bshd", rotary_dim=78)
        assert_close_to(q_out, q_ref, torch.bfloat16)
        assert_close_to(k_out, k_ref, torch.bfloat16)
        q2, k2 = q.clone(), k.clone()
        kiln.rope_(q2, k2, cos, sin, layout="bshd", rotary_dim=78)
        assert torch.equal(q2, q_out) and torch.equal(k2, k_out)
    return check

def backward():
    # dy of 2 x (4 + 2) heads x 33 positions of 72 fp16, [B, H, S, D]; a half table [B, S, 36].
    dq = torch.randn(2, 4, 33, 72, device="cuda", generator=gen).half()
    dk = torch.randn(2, 2, 33, 72, device="cuda", generator=gen).half()
    cos, sin = table(66, 36, torch.float16)
    cos, sin = cos.view(2, 33, 36), sin.view(2, 33, 36)
    full_cos, full_sin = torch.cat((cos, cos), -1)[:, None], torch.cat((sin, sin), -1)[:, None]
    q_ref = rotate(dq, full_cos, full_sin, inverse=True)
    k_ref = rotate(dk, full_cos, full_sin, inverse=True)
    def check():
        poison()
        q_out, k_out = torch.ops.kiln.rope_backward(dq, dk, cos, sin, False, 72)
        assert_close_to(q_out, q_ref, torch.float16)
        assert_close_to(k_out, k_ref, torch.float16)
    return check

checks = [qwen3_vl(), minimax(), backward()]
for check in checks:
    check()  # tunes its problem in full, every candidate checked by the tuner
records = sorted((cache / "v1" / "tune").glob("*/*.json"))
assert len(records) == len(checks), records
pinned = 0
for path in records:
    record = json.loads(path.read_text())
    problem, bucket = path.stem.rsplit(".r", 1)
    failed = [(config_key(t["config"]), t["message"]) for t in record["trials"] if t["status"] != "ok"]
    assert not failed, failed
    flat = sorted({config_key(t["config"]) for t in record["trials"] if "flat" in t["config"].get("extra", {})})
    assert len(flat) >= 6 and {key.split("flat=")[1] for key in flat} == {"1", "2", "4"}, (problem, flat)
    # rope.<dtype>.h<D>.f<flags>.a<align>[.x<rotary dim>]: MiniMax's rotates 78, the backward is fp16.
    check = checks[1] if problem.endswith(".x78") else checks[2] if ".fp16." in problem else checks[0]
    for config in flat:
        kiln.tune_pin(problem=problem, bucket=int(bucket), config=config, cache_dir=str(cache))
        kiln._C.forget_kernels()
        check()
        loaded = [k["config"] for k in kiln._C.loaded_kernels()]
        assert config in loaded, (config, loaded)
        pinned += 1
print("ok", pinned)
"""


def test_every_flat_config_is_correct(tmp_path):
    run_child(CHILD, [str(tmp_path)], tmp_path, "full")
