"""A hand-written tuning database as the runtime stores it (jit/tuning_record): an H100 whose
documents carry a measured copy bandwidth, an H200 whose do not, a prewarm record."""

import json
from pathlib import Path

H100 = "NVIDIA_H100_80GB_HBM3.sm90.132sm.80GiB"
H200 = "NVIDIA_H200.sm90.132sm.141GiB"
RMS_NORM = {"op": "rms_norm", "dtype": "bf16", "hidden": 4096, "flags": 1, "align": 16}
RMS_NORM_KEY = "rms_norm.bf16.h4096.f1.a16"
SWIGLU = {"op": "swiglu", "dtype": "bf16", "hidden": 4096, "flags": 0, "align": 16}
SWIGLU_KEY = "swiglu.bf16.h4096.f0.a16"
# RMSNorm bf16, 4096 rows of 4096 with a weight: x read, y written, the weight read once.
RMS_NORM_BYTES = 2 * (4096 * 4096 * 2 + 4096)


def config(vec, threads, cta):
    return {"vec_bytes": vec, "threads_per_row": threads, "cta_threads": cta}


def trial(cfg, status, median, spread, compile_ms, message=""):
    return {"config": cfg, "status": status, "median_us": median, "spread_us": spread,
            "compile_ms": compile_ms, "repetitions": 50 if status == "ok" else 0,
            "message": message}


def document(problem, bucket, name, fingerprint, copy_gbs, trials, winner, heuristic, tune_ms):
    device = {"name": name, "fingerprint": fingerprint, "sm": 90, "sm_count": 132,
              "memory_bytes": 85899345920, "l2_bytes": 52428800, "bandwidth_gbs": 3352.3}
    if copy_gbs:
        device["copy_bandwidth_gbs"] = copy_gbs
    return {"problem": problem, "bucket_rows": bucket, "mode": "full", "heuristic": heuristic,
            "winner": winner, "reason": "fastest ok candidate", "tune_ms": tune_ms,
            "trials": trials, "versions": {"kiln": "0.1.0", "nvrtc": "12.8", "driver": "13.0"},
            "device": device}


def rms_norm_document(name, fingerprint, copy_gbs):
    heuristic, winner = config(16, 32, 128), config(16, 64, 256)
    trials = [trial(heuristic, "ok", 40.0, 0.4, 120.0),
              trial(winner, "ok", 32.0, 0.2, 130.0),
              trial(config(8, 32, 128), "ok", 50.0, 1.0, 0.0),
              trial(config(16, 1024, 1024), "resource_error", None, None, 90.0,
                    "too many registers <spill> & more"),
              trial(config(4, 32, 128), "wrong_result", None, None, 80.0, "max error 0.25")]
    return document(RMS_NORM, 4096, name, fingerprint, copy_gbs, trials, winner, heuristic, 900.0)


def swiglu_document(name, fingerprint, copy_gbs):
    heuristic, other = config(16, 32, 128), config(16, 64, 256)
    trials = [trial(heuristic, "ok", 20.0, 0.1, 100.0), trial(other, "ok", 20.2, 0.1, 100.0)]
    return document(SWIGLU, 1024, name, fingerprint, copy_gbs, trials, heuristic, heuristic,
                    300.0)


def write(root: Path, device: str, key: str, bucket: int, doc) -> Path:
    path = root / "v1" / "tune" / device / f"{key}.r{bucket}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return path


def make_database(root: Path) -> Path:
    write(root, H100, RMS_NORM_KEY, 4096, rms_norm_document("NVIDIA H100 80GB HBM3", H100, 3000.0))
    write(root, H100, SWIGLU_KEY, 1024, swiglu_document("NVIDIA H100 80GB HBM3", H100, 3000.0))
    write(root, H200, RMS_NORM_KEY, 4096, rms_norm_document("NVIDIA H200", H200, None))
    write(root, "prewarm-sm_90", RMS_NORM_KEY, 0,
          {"source": "prewarm", "problem": RMS_NORM, "arch": "sm_90",
           "winner": config(16, 32, 128), "binary_key": "k", "name_expression": "e",
           "versions": {"kiln": "0.1.0", "nvrtc": "12.8"}})
    return root
