"""The norm backward kernels that load an item's next row while working the current one
(config extra prefetch=1). A full tune measures them, each checked by the tuner against the
heuristic's output; then op calls pinned to the fastest of them are compared with fp64
autograd, on more rows than the grid has items, so every item holds several rows and the
last ones run past the rows (the prefetch of a row that does not exist)."""

import pytest

from norm_variant_cases import PARTIAL_SUMS
from pinned_tune import tune_pin_and_check

pytestmark = pytest.mark.gpu

CHILD = r"""
import sys
import torch
from norm_backward_reference import (adaln_grads, assert_grad_close, fused_add_rms_norm_grads,
                                     layer_norm_grads, rms_norm_grads)
from norm_variant_cases import check_loaded

case, dtype_name, rows, hidden, phase = sys.argv[1:6]
dtype, rows, hidden = getattr(torch, dtype_name), int(rows), int(hidden)
gen = torch.Generator(device="cuda").manual_seed(rows + hidden)


def rand(*shape, offset=0.0, scale=1.0):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale + offset).to(dtype)


def poison():
    junk = [torch.full((rows, hidden), float("nan"), dtype=dtype, device="cuda") for _ in range(3)]
    junk += [torch.full((1024, hidden), float("nan"), device="cuda") for _ in range(3)]
    del junk


w = rand(hidden, offset=1.0, scale=0.5)
dy = rand(rows, hidden)
poison()
if case == "rms_norm":
    x = rand(rows, hidden)
    got = torch.ops.kiln.rms_norm_backward(dy, x, w, 1e-5)
    refs = rms_norm_grads(dy, x, w, 1e-5)
elif case == "rms_norm_frozen":  # dx alone: the items' kernel without sums, beside the row kernel
    x = rand(rows, hidden)
    got = torch.ops.kiln.rms_norm_backward(dy, x, w, 1e-5, False)
    refs = rms_norm_grads(dy, x, w, 1e-5)[:1] + [None]
elif case == "layer_norm_frozen":
    x, b = rand(rows, hidden, offset=1.5, scale=2.0), rand(hidden)
    got = torch.ops.kiln.layer_norm_backward(dy, x, w, b, 1e-5, False, False)
    refs = layer_norm_grads(dy, x, w, b, 1e-5)[:1] + [None, None]
elif case == "fused_add":
    r, dr = rand(rows, hidden, offset=0.3), rand(rows, hidden)
    got = torch.ops.kiln.fused_add_rms_norm_backward(dy, dr, r, w, 1e-5)
    refs = fused_add_rms_norm_grads(dy, dr, r, w, 1e-5)
elif case == "layer_norm":
    x, b = rand(rows, hidden, offset=1.5, scale=2.0), rand(hidden)
    got = torch.ops.kiln.layer_norm_backward(dy, x, w, b, 1e-5)
    refs = layer_norm_grads(dy, x, w, b, 1e-5)
elif case == "adaln_sample":  # LayerNorm, [2, 1, D] scale and shift with table rows: sums per sample
    x, dy = rand(2, rows // 2, hidden, offset=1.0), dy.view(2, rows // 2, hidden)
    scale, shift = rand(2, 1, hidden, scale=0.5), rand(2, 1, hidden, scale=0.5)
    ts, tsh = rand(hidden, scale=0.3), rand(hidden, scale=0.3)
    got = torch.ops.kiln.adaln_backward(dy, x, scale, w, 1e-6, "layer", ts, False,
                                        table_scale_grad=True, table_shift_grad=True)
    refs = adaln_grads(dy, x, scale, shift, w, 1e-6, "layer", ts, tsh)
assert len(got) == len(refs)
for name, g, ref in zip(("first", "second", "third", "fourth", "fifth", "sixth"), got, refs):
    if ref is None:
        assert g is None, f"{case} {name} gradient: not asked for, yet returned"
        continue
    assert_grad_close(g, ref, dtype, f"{case} {name} gradient")
if phase == "check":
    check_loaded(sys.argv[6])  # the pinned variant, e.g. "prefetch=1"
print("ok")
"""

# More rows than items (NormBackwardFamily::slots: 256 items at 4096 wide, 128 a sample for
# the per-sample sums of two samples), with rows left over for the last pass; odd widths
# run the last step of a thread past the row.
CASES = [("rms_norm", "bfloat16", 1031, 4096), ("rms_norm", "float32", 3001, 768),
         ("fused_add", "float16", 1031, 4545), ("layer_norm", "bfloat16", 2051, 2048),
         ("adaln_sample", "bfloat16", 1202, 3072),
         # Nothing summed: the tuner weighs these against kiln::norm_backward_rows, whose
         # output (the heuristic's) each trial is checked against.
         ("rms_norm_frozen", "bfloat16", 1031, 4096), ("layer_norm_frozen", "float16", 2051, 4545)]


@pytest.mark.parametrize("case,dtype,rows,hidden", CASES)
def test_prefetch_kernels_are_tuned_checked_and_correct(tmp_path, case, dtype, rows, hidden):
    # The partial sums' tune (their own problem) has no prefetching configs.
    tune_pin_and_check(CHILD, [case, dtype, str(rows), str(hidden)], tmp_path, "prefetch",
                       skip=PARTIAL_SUMS)
