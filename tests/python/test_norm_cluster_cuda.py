"""The norm kernels that split each row over a thread-block cluster (config extra cluster=N,
sm_90: the row's slices live in N CTAs, whose partial sums meet in distributed shared memory).
A full tune measures them, each checked by the tuner against the heuristic's output on
poisoned buffers; then op calls pinned to the fastest of them are compared with fp64 math,
for every op of the family, fp32/fp16/bf16, with and without weight, one row and many, an
odd hidden size (a partial last step, in one CTA of the cluster only), a narrow row whose five
streams make it eligible (per-token gated_adaln 2048 wide), more rows than SMs (per-token
gated_adaln 8192 wide, whose rows the fast search also offers to pairs of CTAs), and inputs
whose mean is far from zero (LayerNorm)."""

import pytest
import torch

from norm_variant_cases import NORM_CASE_CHILD
from pinned_tune import pin_fastest_variant, run_child

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or
                       torch.cuda.get_device_capability() < (9, 0),
                       reason="thread-block clusters need an sm_90 GPU"),
]

@pytest.mark.parametrize("case,dtype,rows,hidden", [
    ("rms_norm", "bfloat16", 37, 8192), ("rms_norm", "float16", 1, 8192),
    ("rms_norm", "float32", 5, 8192), ("rms_norm", "bfloat16", 3, 8193),
    ("rms_norm_no_weight", "bfloat16", 1, 14848), ("fused_add", "bfloat16", 9, 8192),
    ("layer_norm", "bfloat16", 6, 8192), ("layer_norm", "float32", 1, 6000),
    ("adaln_layer", "bfloat16", 4, 8192), ("gated", "bfloat16", 7, 8192),
    ("gated", "bfloat16", 301, 8192),
    ("gated", "float16", 3, 2048),
    ("gated_sample", "bfloat16", 2, 14848)])
def test_clustered_kernels_are_tuned_checked_and_correct(tmp_path, case, dtype, rows, hidden):
    # The DiT ops take [2, T, hidden] with T = rows / 2, rounded up.
    args = [case, dtype, str(rows), str(hidden), str((rows + 1) // 2), "13", "cluster="]
    run_child(NORM_CASE_CHILD, args + ["tune"], tmp_path, "full")
    pin_fastest_variant(tmp_path, "cluster")
    run_child(NORM_CASE_CHILD, args + ["check"], tmp_path, "fast")
