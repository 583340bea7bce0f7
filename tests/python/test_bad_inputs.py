"""Every bad input is a clear error naming the op, the argument, the expected and the given."""

import os
import subprocess
import sys

import pytest
import torch

import kiln


def test_unsupported_dtype():
    # float64 is a CPU-only reference dtype (for gradcheck); CUDA rejects it (test_norm_backward_cuda.py).
    assert kiln.rms_norm(torch.randn(2, 8, dtype=torch.float64)).dtype == torch.float64
    with pytest.raises(TypeError, match=r"kiln.rms_norm: x: expected dtype float32, float16, bfloat16 or float64, got int64"):
        kiln.rms_norm(torch.ones(2, 8, dtype=torch.int64))


def test_hidden_size_zero():
    with pytest.raises(ValueError, match=r"kiln.rms_norm: x: expected a last dimension \(hidden size\) > 0, got \[2, 0\]"):
        kiln.rms_norm(torch.randn(2, 0))


def test_weight_dtype_mismatch():
    with pytest.raises(TypeError, match=r"kiln.rms_norm: weight: expected dtype bfloat16 \(as x\), got float32"):
        kiln.rms_norm(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(8))


def test_weight_shape_mismatch():
    with pytest.raises(ValueError, match=r"kiln.rms_norm: weight: expected shape \[8\] \(x's last dimension\), got \[7\]"):
        kiln.rms_norm(torch.randn(2, 8), torch.randn(7))
    with pytest.raises(ValueError, match=r"weight: expected shape \[8\]"):
        kiln.rms_norm(torch.randn(2, 8), torch.randn(2, 8))


def test_arch_older_than_sm75():
    with pytest.raises(ValueError, match=r"kiln.compile: arch: expected sm_75 or newer, got sm_70"):
        kiln.compile("rms_norm", "bf16", 4096, arch="sm_70")


def test_bad_compile_arguments():
    with pytest.raises(ValueError, match=r"kiln.compile: dtype: expected fp32, fp16 or bf16, got 'fp64'"):
        kiln.compile("rms_norm", "fp64", 4096)
    with pytest.raises(ValueError, match=r"kiln.compile: op: .*got 'softmax'"):
        kiln.compile("softmax", "bf16", 4096)
    with pytest.raises(ValueError, match=r"rms_norm: x: expected hidden size in \[1, 65536\]"):
        kiln.compile("rms_norm", "bf16", 0)


def test_missing_nvrtc_is_a_clear_error(tmp_path):
    env = dict(os.environ, KILN_NVRTC=str(tmp_path / "libnvrtc-missing.so"),
               KILN_CACHE_DIR=str(tmp_path / "cache"))
    code = "import kiln; kiln.compile('rms_norm', 'bf16', 4096, arch='sm_90')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode != 0
    assert "KILN_NVRTC" in out.stderr and "libnvrtc-missing.so" in out.stderr, out.stderr
    assert not list((tmp_path / "cache").rglob("*.bin")), "a failed compile left a cache entry"


@pytest.mark.gpu
def test_cpu_x_with_cuda_weight():
    # The dispatcher routes a CPU x to the CPU implementation, which names the mismatch.
    with pytest.raises(ValueError, match=r"kiln.rms_norm: weight: expected device cpu \(as x\), got cuda:0"):
        kiln.rms_norm(torch.randn(2, 8), torch.randn(8, device="cuda"))


@pytest.mark.gpu
def test_cuda_weight_dtype_mismatch():
    with pytest.raises(TypeError, match=r"kiln.rms_norm: weight: expected dtype float16 \(as x\), got float32"):
        kiln.rms_norm(torch.randn(2, 8, device="cuda", dtype=torch.half), torch.randn(8, device="cuda"))
