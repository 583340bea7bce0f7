"""The norm kernels that stage their row in shared memory (config extra stage=1: the row's
streams are copied there with cp.async instead of held in registers). A full tune measures
them, each checked by the tuner against the heuristic's output on poisoned buffers; then op
calls pinned to the fastest of them are compared with fp64 math, for every op of the family,
fp32/fp16/bf16, with and without weight, rows that do not fill the last CTA, and inputs whose
mean is far from zero (LayerNorm)."""

import pytest

from pinned_tune import pin_fastest_variant, run_child

pytestmark = pytest.mark.gpu

# Run in a child process so each phase starts with no kernel loaded: the first tunes (full),
# the second runs with the pinned results and checks outputs and the configs it loaded.
CHILD = r"""
import sys
import torch
import kiln
from reference import (adaln_fp64, assert_close_to, fused_add_rms_norm_fp64, gated_adaln_fp64,
                       layer_norm_fp64, rms_norm_fp64)

case, dtype_name, phase = sys.argv[1:4]
dtype = getattr(torch, dtype_name)
gen = torch.Generator(device="cuda").manual_seed(11)

def rand(*shape, offset=0.0, scale=1.0):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale + offset).to(dtype)

rows, hidden = 37, 8192
if case == "rms_norm":
    x, w = rand(rows, hidden), rand(hidden, offset=1.0, scale=0.5)
    assert_close_to(kiln.rms_norm(x, w, 1e-5), rms_norm_fp64(x, w, 1e-5), dtype)
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
    # A mean of 20 over 8192 fp32 values costs fp32 sums ~1e-5 of the output by itself (the
    # reference tolerance), in any kernel; 16-bit outputs round far above that.
    offset = 4.0 if dtype == torch.float32 else 20.0
    x, w, b = rand(rows, hidden, offset=offset), rand(hidden, offset=1.0, scale=0.5), rand(hidden)
    assert_close_to(kiln.layer_norm(x, w, b, 1e-5), layer_norm_fp64(x, w, b, 1e-5), dtype)
elif case == "adaln_layer":
    b, t = 2, 75
    x = rand(b, t, hidden, offset=20.0)
    scale, shift = rand(b, t, hidden, scale=0.3), rand(b, t, hidden, scale=0.3)
    ts, tsh = rand(hidden, scale=0.3), rand(hidden, scale=0.3)
    ref = adaln_fp64(x, scale, shift, None, 1e-6, "layer", ts, tsh)
    assert_close_to(kiln.adaln(x, scale, shift, None, 1e-6, "layer", ts, tsh), ref, dtype)
else:
    # gated: per-token operands (five staged streams); gated_sample: one [B, 1, D] row each
    # (two staged streams, the modulation rows through L1).
    b, t = 2, 75
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
    assert configs and all("stage=1" in c for c in configs), configs
print("ok")
"""


@pytest.mark.parametrize("case,dtype", [
    ("rms_norm", "bfloat16"), ("rms_norm", "float16"), ("rms_norm", "float32"),
    ("rms_norm_no_weight", "bfloat16"), ("fused_add", "bfloat16"), ("fused_add", "float32"),
    ("layer_norm", "bfloat16"), ("layer_norm", "float32"), ("adaln_layer", "bfloat16"),
    ("gated", "bfloat16"), ("gated", "float16"), ("gated_sample", "bfloat16")])
def test_staged_kernels_are_tuned_checked_and_correct(tmp_path, case, dtype):
    run_child(CHILD, [case, dtype, "tune"], tmp_path, "full")
    pin_fastest_variant(tmp_path, "stage")
    run_child(CHILD, [case, dtype, "check"], tmp_path, "fast")
