"""The norm kernels that split each row over a thread-block cluster (config extra cluster=N,
sm_90: the row's slices live in N CTAs, whose partial sums meet in distributed shared memory).
A full tune measures them, each checked by the tuner against the heuristic's output on
poisoned buffers; then op calls pinned to the fastest of them are compared with fp64 math,
for every op of the family, fp32/fp16/bf16, with and without weight, one row and many, an
odd hidden size (a partial last step, in one CTA of the cluster only), a narrow row whose five
streams make it eligible (per-token gated_adaln 2048 wide), and inputs whose mean is far from
zero (LayerNorm)."""

import pytest
import torch

from pinned_tune import pin_fastest_variant, run_child

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or
                       torch.cuda.get_device_capability() < (9, 0),
                       reason="thread-block clusters need an sm_90 GPU"),
]

# Run in a child process so each phase starts with no kernel loaded: the first tunes (full),
# the second runs with the pinned results and checks outputs and the configs it loaded.
CHILD = r"""
import sys
import torch
import kiln
from reference import (adaln_fp64, assert_close_to, fused_add_rms_norm_fp64, gated_adaln_fp64,
                       layer_norm_fp64, rms_norm_fp64)

case, dtype_name, rows, hidden, phase = sys.argv[1:6]
rows, hidden = int(rows), int(hidden)
dtype = getattr(torch, dtype_name)
gen = torch.Generator(device="cuda").manual_seed(13)

def rand(*shape, offset=0.0, scale=1.0):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale + offset).to(dtype)

def fresh(like):
    # A poisoned output buffer: a slice the kernel skips shows as NaN.
    return torch.full_like(like, float("nan"))

if case == "rms_norm":
    x, w = rand(rows, hidden), rand(hidden, offset=1.0, scale=0.5)
    out = fresh(x)
    assert kiln.rms_norm(x, w, 1e-5, out=out) is out
    assert_close_to(out, rms_norm_fp64(x, w, 1e-5), dtype)
elif case == "rms_norm_no_weight":
    x = rand(rows, hidden)
    assert_close_to(kiln.rms_norm(x, None, 1e-5), rms_norm_fp64(x, None, 1e-5), dtype)
elif case == "fused_add":
    x, r, w = rand(rows, hidden), rand(rows, hidden, offset=0.3), rand(hidden, offset=1.0, scale=0.5)
    ref_out, ref_s = fused_add_rms_norm_fp64(x, r, w, 1e-5)
    out, s = kiln.fused_add_rms_norm(x, r, w, 1e-5)
    assert_close_to(s, ref_s, dtype)
    assert_close_to(out, ref_out, dtype)
    kiln.fused_add_rms_norm_(x, r, w, 1e-5)
    assert_close_to(r, ref_s, dtype)
    assert_close_to(x, ref_out, dtype)
elif case == "layer_norm":
    # A mean far from zero: the two sums (mean, then centred squares) cross the cluster.
    offset = 4.0 if dtype == torch.float32 else 20.0
    x, w, b = rand(rows, hidden, offset=offset), rand(hidden, offset=1.0, scale=0.5), rand(hidden)
    assert_close_to(kiln.layer_norm(x, w, b, 1e-5), layer_norm_fp64(x, w, b, 1e-5), dtype)
elif case == "adaln_layer":
    b, t = 2, (rows + 1) // 2
    x = rand(b, t, hidden, offset=20.0)
    scale, shift = rand(b, t, hidden, scale=0.3), rand(b, t, hidden, scale=0.3)
    ts, tsh = rand(hidden, scale=0.3), rand(hidden, scale=0.3)
    ref = adaln_fp64(x, scale, shift, None, 1e-6, "layer", ts, tsh)
    assert_close_to(kiln.adaln(x, scale, shift, None, 1e-6, "layer", ts, tsh), ref, dtype)
else:
    # gated: per-token operands; gated_sample: one [B, 1, D] row each.
    b, t = 2, (rows + 1) // 2
    h, y = rand(b, t, hidden, offset=3.0), rand(b, t, hidden)
    gate, scale, shift = (rand(b, 1 if case == "gated_sample" else t, hidden, scale=0.3) for _ in range(3))
    w = rand(hidden, offset=1.0, scale=0.5)
    tg, ts, tsh = (rand(hidden, scale=0.3) for _ in range(3))
    ref_h, ref_out = gated_adaln_fp64(h, y, gate, scale, shift, w, 1e-6, "rms", tg, ts, tsh)
    h2, out = kiln.gated_adaln(h, y, gate, scale, shift, w, 1e-6, "rms", tg, ts, tsh)
    assert_close_to(h2, ref_h, dtype)
    assert_close_to(out, ref_out, dtype)
torch.cuda.synchronize()
if phase == "check":
    configs = [k["config"] for k in kiln._C.loaded_kernels()]
    assert configs and all("cluster=" in c for c in configs), configs
print("ok")
"""


@pytest.mark.parametrize("case,dtype,rows,hidden", [
    ("rms_norm", "bfloat16", 37, 8192), ("rms_norm", "float16", 1, 8192),
    ("rms_norm", "float32", 5, 8192), ("rms_norm", "bfloat16", 3, 8193),
    ("rms_norm_no_weight", "bfloat16", 1, 14848), ("fused_add", "bfloat16", 9, 8192),
    ("layer_norm", "bfloat16", 6, 8192), ("layer_norm", "float32", 1, 6000),
    ("adaln_layer", "bfloat16", 4, 8192), ("gated", "bfloat16", 7, 8192),
    ("gated", "float16", 3, 2048),
    ("gated_sample", "bfloat16", 2, 14848)])
def test_clustered_kernels_are_tuned_checked_and_correct(tmp_path, case, dtype, rows, hidden):
    args = [case, dtype, str(rows), str(hidden)]
    run_child(CHILD, args + ["tune"], tmp_path, "full")
    pin_fastest_variant(tmp_path, "cluster")
    run_child(CHILD, args + ["check"], tmp_path, "fast")
