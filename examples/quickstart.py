"""kiln's main job, end to end.

On a GPU machine: JIT-compile and tune RMSNorm (bf16, Llama-3-8B's hidden size 4096) for
the GPU found, check it against PyTorch, and print the time, bandwidth and chosen config.
On a machine with no GPU: say so, and compile RMSNorm for sm_75, sm_80 and sm_90.
"""

import json
import os
import sys
import time

import torch

import kiln

HIDDEN = 4096
ROWS = 8192
EPS = 1e-6


def offline():
    print("kiln: no CUDA GPU here; compiling RMSNorm offline with NVRTC instead")
    for arch in ("sm_75", "sm_80", "sm_90"):
        for dtype in ("fp32", "fp16", "bf16"):
            result = kiln.compile("rms_norm", dtype=dtype, hidden=HIDDEN, arch=arch, format="cubin")
            source = "cache" if result["from_cache"] else f"{result['compile_ms']:.0f} ms"
            print(f"  {arch} {dtype}: {result['name_expression']}  "
                  f"{len(result['binary'])} bytes of cubin ({source})")
    print(f"kiln: binaries cached under {kiln.settings()['cache_dir']}")


def on_gpu():
    info = kiln.device_info(0)
    print(f"kiln: {info['name']} ({info['arch']}, {info['sm_count']} SMs, "
          f"~{info['datasheet_bandwidth_gbs']:.0f} GB/s datasheet)")
    x = torch.randn(ROWS, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)

    torch.cuda.synchronize()
    start = time.perf_counter()
    out = kiln.rms_norm(x, w, EPS)  # first call: compile + tune (or the disk cache)
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - start) * 1e3

    reference = torch.nn.functional.rms_norm(x.float(), (HIDDEN,), w.float(), EPS)
    error = ((out.float() - reference).norm() / reference.norm()).item()
    ok = error < 1e-2
    print(f"kiln: matches torch.nn.functional.rms_norm: {'yes' if ok else 'NO'} "
          f"(relative error {error:.1e})")

    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for _ in range(10):
        kiln.rms_norm(x, w, EPS)
    events[0].record()
    for _ in range(100):
        kiln.rms_norm(x, w, EPS)
    events[1].record()
    torch.cuda.synchronize()
    us = events[0].elapsed_time(events[1]) * 10  # ms / 100 calls -> us per call
    moved = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
    print(f"kiln: rms_norm {ROWS}x{HIDDEN} bf16: {us:.1f} us per call, {moved / us / 1e3:.0f} GB/s; "
          f"first call {first_ms:.0f} ms")

    cache_dir = kiln.settings()["cache_dir"]
    tune_dir = os.path.join(cache_dir, "v1", "tune", info["fingerprint"])
    for name in sorted(os.listdir(tune_dir)) if os.path.isdir(tune_dir) else []:
        if name.startswith("rms_norm.bf16.h4096"):
            with open(os.path.join(tune_dir, name)) as f:
                doc = json.load(f)
            print(f"kiln: chose {doc['winner']} for {name}: {doc.get('reason', '')}")
    return 0 if ok else 1


def main():
    if kiln.device_count() == 0 or not torch.cuda.is_available():
        offline()
        return 0
    return on_gpu()


if __name__ == "__main__":
    sys.exit(main())
