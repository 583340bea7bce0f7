"""The norm kernels that stage their row in shared memory (config extra stage=1: the row's
streams are copied there with cp.async instead of held in registers). A full tune measures
them, each checked by the tuner against the heuristic's output on poisoned buffers; then op
calls pinned to the fastest of them are compared with fp64 math, for every op of the family,
fp32/fp16/bf16, with and without weight, rows that do not fill the last CTA, and inputs whose
mean is far from zero (LayerNorm)."""

import pytest

from norm_variant_cases import NORM_CASE_CHILD
from pinned_tune import pin_fastest_variant, run_child

pytestmark = pytest.mark.gpu

@pytest.mark.parametrize("case,dtype", [
    ("rms_norm", "bfloat16"), ("rms_norm", "float16"), ("rms_norm", "float32"),
    ("rms_norm_no_weight", "bfloat16"), ("fused_add", "bfloat16"), ("fused_add", "float32"),
    ("layer_norm", "bfloat16"), ("layer_norm", "float32"), ("adaln_layer", "bfloat16"),
    ("gated", "bfloat16"), ("gated", "float16"), ("gated_sample", "bfloat16")])
def test_staged_kernels_are_tuned_checked_and_correct(tmp_path, case, dtype):
    # 37 rows (the last CTA not full), or [2, 75] tokens, of 8192. gated: five staged streams
    # (per-token operands); gated_sample: two, the modulation rows through L1.
    args = [case, dtype, "37", "8192", "75", "11", "stage=1"]
    run_child(NORM_CASE_CHILD, args + ["tune"], tmp_path, "full")
    pin_fastest_variant(tmp_path, "stage")
    run_child(NORM_CASE_CHILD, args + ["check"], tmp_path, "fast")
