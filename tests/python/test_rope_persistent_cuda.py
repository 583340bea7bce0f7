"""The video RoPE kernels' persistent grids (config extra grid=N: N CTAs, each thread loading
its next rows while it rotates the current ones): rms_norm_rope with coordinates or a table,
and rope_3d. A full tune measures them, each checked by the tuner against the heuristic's
output on poisoned buffers; then op calls pinned to the fastest of them are compared with
fp64 math on more tokens than one pass of the grid covers (so every thread prefetches, and
the last pass is partial), at widths with one (2048) and two (1000) padding pairs. The same
for rms_norm_rope's one-pass kernel with coordinates held to fewer registers (min_ctas=N)."""

import pytest

from pinned_tune import pin_fastest_variant, run_child

pytestmark = pytest.mark.gpu

# Run in a child process so each phase starts with no kernel loaded: the first tunes (full),
# the second runs with the pinned results and checks outputs and the configs it loaded.
CHILD = r"""
import sys
import torch
import kiln
from reference import assert_close_to
from rope_reference import ltx_apply_rotary_emb, rms_norm_across_heads
from test_rope_cpu import assert_video_close, video_reference

case, dtype_name, dim, phase, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
dtype = getattr(torch, dtype_name)
gen = torch.Generator(device="cuda").manual_seed(11)
frames, height, width, scale = 5, 13, 31, (0.32, 32, 32)
s = frames * height * width
cos, sin = video_reference(2, dim, frames, height, width, scale)
q = torch.randn(2, s, dim, device="cuda", generator=gen).to(dtype)
k = torch.randn(2, s, dim, device="cuda", generator=gen).to(dtype)
if case == "rope_3d":
    q_out, k_out = kiln.rope_3d(q, k, frames, height, width, scale)
    q_in, k_in = q, k
else:
    wq = (torch.randn(dim, device="cuda", generator=gen) * 0.2 + 1).to(dtype)
    wk = (torch.randn(dim, device="cuda", generator=gen) * 0.2 + 1).to(dtype)
    q_in, k_in = rms_norm_across_heads(q, wq, 1e-5, dtype), rms_norm_across_heads(k, wk, 1e-5, dtype)
    if case == "coordinates":
        q_out, k_out = kiln.rms_norm_rope(q, k, wq, wk, 1e-5, grid=(frames, height, width),
                                          rope_interpolation_scale=scale)
    else:
        q_out, k_out = kiln.rms_norm_rope(q, k, wq, wk, 1e-5, cos.float().cuda(), sin.float().cuda())
for out, x in ((q_out, q_in), (k_out, k_in)):
    ref = ltx_apply_rotary_emb(x, cos.cuda(), sin.cuda())
    if case == "table":
        assert_close_to(out, ref, dtype)
    else:
        assert_video_close(out.cpu(), ref.cpu(), dtype, cos, x.cpu())
torch.cuda.synchronize()
if phase == "check":
    configs = [k["config"] for k in kiln._C.loaded_kernels()]
    assert configs and all(f".{extra}=" in c for c in configs), configs
print("ok")
"""


@pytest.mark.parametrize("case,dtype,dim,extra", [("coordinates", "bfloat16", 2048, "grid"),
                                                  ("coordinates", "float16", 1000, "grid"),
                                                  ("coordinates", "float32", 2048, "grid"),
                                                  ("table", "bfloat16", 2048, "grid"),
                                                  ("rope_3d", "bfloat16", 2048, "grid"),
                                                  ("rope_3d", "float32", 1000, "grid"),
                                                  ("coordinates", "bfloat16", 2048, "min_ctas"),
                                                  ("coordinates", "float16", 1000, "min_ctas"),
                                                  ("coordinates", "float32", 2048, "min_ctas")])
def test_tuned_variants_are_checked_and_correct(tmp_path, case, dtype, dim, extra):
    run_child(CHILD, [case, dtype, str(dim), "tune", extra], tmp_path, "full")
    pin_fastest_variant(tmp_path, extra)
    run_child(CHILD, [case, dtype, str(dim), "check", extra], tmp_path, "fast")
