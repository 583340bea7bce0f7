import subprocess
import sys

import pytest
import torch

import kiln


def test_import_and_op_registered():
    assert hasattr(torch.ops.kiln, "rms_norm")
    schema = str(torch.ops.kiln.rms_norm.default._schema)
    assert schema.startswith("kiln::rms_norm(Tensor x, Tensor? weight, float eps=")


def test_settings_default_and_configure(tmp_path):
    before = kiln.settings()
    assert before["cache_mode"] in ("rw", "ro", "off", "strict")
    assert before["tune_mode"] in ("off", "fast", "full")
    kiln.configure(cache_dir=str(tmp_path), tune="off")
    try:
        assert kiln.settings()["cache_dir"] == str(tmp_path)
        assert kiln.settings()["tune_mode"] == "off"
        with pytest.raises(ValueError, match="tune.*off, fast or full.*sometimes"):
            kiln.configure(tune="sometimes")
    finally:
        kiln.configure(cache_dir=before["cache_dir"], tune=before["tune_mode"])


def test_import_without_gpu_in_a_fresh_process():
    code = ("import kiln, torch; "
            "print(kiln.device_count() >= 0, hasattr(torch.ops.kiln, 'rms_norm'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True True"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_device_info_without_gpu_is_a_clear_error():
    assert kiln.device_count() == 0
    with pytest.raises(RuntimeError, match="(?i)cuda"):
        kiln.device_info(0)
