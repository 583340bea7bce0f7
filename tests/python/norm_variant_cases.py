"""The op calls that the GPU tests of the norm kernels' tuned variants (re-read rows, rows
staged in shared memory, rows split over a cluster) check against fp64 math, run in a child
process (pinned_tune.run_child) so that each phase starts with no kernel loaded.

NORM_CASE_CHILD's arguments: case dtype rows hidden tokens seed marker phase. Cases:
  rms_norm, rms_norm_no_weight, fused_add, layer_norm   [rows, hidden]
  adaln_rms, adaln_layer[_sample]                       [2, tokens, hidden], per-token scale
                                                        and shift with table rows; _sample:
                                                        one [2, 1, hidden] row of each per
                                                        sample
  gated[_layer][_sample]                                [2, tokens, hidden]; _layer: LayerNorm
                                                        without weight of rows whose mean is far
                                                        from zero, else RMSNorm with weight;
                                                        _sample: one [2, 1, hidden] row of gate,
                                                        scale and shift per sample
In the "check" phase every kernel the child loaded must have `marker` in its config."""

import torch

import kiln
from reference import (adaln_fp64, assert_close_to, fused_add_rms_norm_fp64, gated_adaln_fp64,
                       layer_norm_fp64, rms_norm_fp64)

NORM_CASE_CHILD = r"""
import sys
from norm_variant_cases import check_loaded, check_norm_case
case, dtype, rows, hidden, tokens, seed, marker, phase = sys.argv[1:9]
check_norm_case(case, dtype, int(rows), int(hidden), int(tokens), int(seed))
if phase == "check":
    check_loaded(marker)
print("ok")
"""


def check_norm_case(case, dtype_name, rows, hidden, tokens, seed):
    """Runs `case` through kiln on fresh random inputs and compares with fp64 math."""
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, offset=0.0, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale + offset).to(dtype)

    if case == "rms_norm":
        x, w = rand(rows, hidden), rand(hidden, offset=1.0, scale=0.5)
        out = torch.full_like(x, float("nan"))  # poisoned: a slice the kernel skips shows
        assert kiln.rms_norm(x, w, 1e-5, out=out) is out
        assert_close_to(out, rms_norm_fp64(x, w, 1e-5), dtype)
    elif case == "rms_norm_no_weight":
        x = rand(rows, hidden)
        assert_close_to(kiln.rms_norm(x, None, 1e-5), rms_norm_fp64(x, None, 1e-5), dtype)
    elif case == "fused_add":
        x, r = rand(rows, hidden), rand(rows, hidden, offset=0.3)
        w = rand(hidden, offset=1.0, scale=0.5)
        ref_out, ref_s = fused_add_rms_norm_fp64(x, r, w, 1e-5)
        out, s = kiln.fused_add_rms_norm(x, r, w, 1e-5)
        assert_close_to(s, ref_s, dtype)
        assert_close_to(out, ref_out, dtype)
        kiln.fused_add_rms_norm_(x, r, w, 1e-5)
        assert_close_to(r, ref_s, dtype)
        assert_close_to(x, ref_out, dtype)
    elif case == "layer_norm":
        # A mean of 20 over 8192 fp32 values costs fp32 sums ~1e-5 of the output by itself
        # (the reference tolerance), in any kernel; 16-bit outputs round far above that.
        offset = 4.0 if dtype == torch.float32 else 20.0
        x, w, b = rand(rows, hidden, offset=offset), rand(hidden, offset=1.0, scale=0.5), rand(hidden)
        if dtype != torch.float32:
            # An outlying first value (40 std from the rest), which the LayerNorm kernels'
            # shifted sums must not take as their shift alone.
            x[:, 0] += 40.0
        assert_close_to(kiln.layer_norm(x, w, b, 1e-5), layer_norm_fp64(x, w, b, 1e-5), dtype)
    elif case in ("adaln_rms", "adaln_layer", "adaln_rms_sample", "adaln_layer_sample"):
        norm = case.removeprefix("adaln_").removesuffix("_sample")
        x = rand(2, tokens, hidden, offset=20.0 if norm == "layer" else 0.0)
        modulated = 1 if case.endswith("_sample") else tokens
        scale, shift = rand(2, modulated, hidden, scale=0.3), rand(2, modulated, hidden, scale=0.3)
        ts, tsh = rand(hidden, scale=0.3), rand(hidden, scale=0.3)
        ref = adaln_fp64(x, scale, shift, None, 1e-6, norm, ts, tsh)
        assert_close_to(kiln.adaln(x, scale, shift, None, 1e-6, norm, ts, tsh), ref, dtype)
    elif case in ("gated", "gated_sample", "gated_layer", "gated_layer_sample"):
        layer = "_layer" in case
        norm = "layer" if layer else "rms"
        h, y = rand(2, tokens, hidden, offset=20.0 if layer else 3.0), rand(2, tokens, hidden)
        modulated = 1 if case.endswith("_sample") else tokens
        gate, scale, shift = (rand(2, modulated, hidden, scale=0.3) for _ in range(3))
        w = None if layer else rand(hidden, offset=1.0, scale=0.5)
        tg, ts, tsh = (rand(hidden, scale=0.3) for _ in range(3))
        ref_h, ref_out = gated_adaln_fp64(h, y, gate, scale, shift, w, 1e-6, norm, tg, ts, tsh)
        h2, out = kiln.gated_adaln(h, y, gate, scale, shift, w, 1e-6, norm, tg, ts, tsh)
        assert_close_to(h2, ref_h, dtype)
        assert_close_to(out, ref_out, dtype)
    else:
        raise ValueError(f"unknown case {case!r}")
    torch.cuda.synchronize()


# The norm backward's partial sums are a problem of their own (kNormSumPartials, flags 8192):
# their kernel takes none of the row kernels' extras.
PARTIAL_SUMS = ".f8192."


def check_loaded(marker):
    """Every kernel loaded in this process but the partial sums' has `marker` (e.g.
    "stage=1") in its config."""
    configs = [k["config"] for k in kiln._C.loaded_kernels() if PARTIAL_SUMS not in k["problem"]]
    assert configs and all(marker in c for c in configs), configs
