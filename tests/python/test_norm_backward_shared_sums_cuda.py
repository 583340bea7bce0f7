"""The norm backward kernels that hold the parameter sums in shared memory (config extra
shared_sums=1, offered past 8192 wide). A full tune measures them, each checked by the tuner
against the heuristic's output; then op calls pinned to the fastest of them, with and without
prefetch, are compared with fp64 autograd on more rows than the grid has items."""

import pytest

from norm_variant_cases import PARTIAL_SUMS
from pinned_tune import tune_pin_and_check
from test_norm_backward_prefetch_cuda import CHILD

pytestmark = pytest.mark.gpu

# 256 items at these widths (NormBackwardFamily::slots), so each holds several rows; odd row
# counts leave the last pass short. adaln_sample sums three gradients (weight, scale, shift)
# per sample; fused_add a single one.
CASES = [("layer_norm", "bfloat16", 1031, 14848), ("rms_norm", "float32", 1031, 14848),
         ("fused_add", "float16", 777, 9216), ("adaln_sample", "bfloat16", 1202, 12288)]


@pytest.mark.parametrize("case,dtype,rows,hidden", CASES)
def test_shared_sums_kernels_are_tuned_checked_and_correct(tmp_path, case, dtype, rows, hidden):
    tune_pin_and_check(CHILD, [case, dtype, str(rows), str(hidden)], tmp_path, "shared_sums",
                       skip=PARTIAL_SUMS)
