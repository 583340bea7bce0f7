"""The norm ops' re-read kernels (config extra reread=1: the row is read a second time
instead of held; the fused ops store their sum row and read that back). Every norm op is
offered them for rows of 4 KB or more. A full tune measures them, each
checked by the tuner against the heuristic's output on poisoned buffers; then op calls pinned
to the fastest of them are compared with fp64 math, on inputs whose mean is far from zero
(LayerNorm's shifted sums)."""

import pytest

from norm_variant_cases import NORM_CASE_CHILD
from pinned_tune import pin_fastest_variant, run_child

pytestmark = pytest.mark.gpu

# Test cases that run a child case of another name (norm_variant_cases.check_norm_case).
CHILD_CASE = {"rms_norm_one_row": "rms_norm", "layer_norm_narrow": "layer_norm"}

# Shapes: 37 rows of 4544; adaln_rms [2, 75] tokens 4545 wide (the last step of a thread
# runs past the row); adaln_layer [2, 75] of 8192; the gated ops [2, 150] of 8192. The ops
# whose only row stream is x (read in one go on each pass): rms_norm 1 and 300 rows, 4545
# and 8192 wide; layer_norm 37 rows of 3072 (rows under 4 KB are held, so fp32 only) and
# 300 of 8192; adaln with a row of scale and shift per sample, [2, 75] of 4545 and 8192.
SHAPES = {"fused_add": ("37", "4544", "0"), "adaln_rms": ("0", "4545", "75"),
          "adaln_layer": ("0", "8192", "75"), "gated_layer": ("0", "8192", "150"),
          "gated_layer_sample": ("0", "8192", "150"), "rms_norm": ("300", "4545", "0"),
          "rms_norm_one_row": ("1", "8192", "0"), "rms_norm_no_weight": ("300", "8192", "0"),
          "layer_norm": ("300", "8192", "0"), "layer_norm_narrow": ("37", "3072", "0"),
          "adaln_rms_sample": ("0", "4545", "75"), "adaln_layer_sample": ("0", "8192", "75")}


@pytest.mark.parametrize("case,dtype", [("fused_add", "float32"), ("fused_add", "float16"),
                                        ("fused_add", "bfloat16"), ("gated_layer", "bfloat16"),
                                        ("gated_layer", "float16"),
                                        ("gated_layer_sample", "bfloat16"),
                                        ("adaln_rms", "bfloat16"), ("adaln_rms", "float32"),
                                        ("adaln_layer", "float16"), ("rms_norm", "bfloat16"),
                                        ("rms_norm", "float16"), ("rms_norm", "float32"),
                                        ("rms_norm_one_row", "bfloat16"),
                                        ("rms_norm_no_weight", "bfloat16"),
                                        ("layer_norm", "bfloat16"), ("layer_norm", "float16"),
                                        ("layer_norm_narrow", "float32"),
                                        ("adaln_rms_sample", "bfloat16"),
                                        ("adaln_layer_sample", "float16"),
                                        ("adaln_layer_sample", "float32")])
def test_reread_kernels_are_tuned_checked_and_correct(tmp_path, case, dtype):
    args = [CHILD_CASE.get(case, case), dtype, *SHAPES[case], "7", "reread=1"]
    run_child(NORM_CASE_CHILD, args + ["tune"], tmp_path, "full")
    pin_fastest_variant(tmp_path, "reread")
    run_child(NORM_CASE_CHILD, args + ["check"], tmp_path, "fast")
