"""What writing a new tensor costs beside writing one allocated once, timed as the benches time
kiln (bench/common.py: the L2 flush before every call, CUDA events around it, interleaved
rounds). kiln's ops, like their peers, return a new tensor each call, while the benches'
same-size copy (common.same_bytes_copy) writes one fixed buffer; at 128 x 4096 kiln's RMSNorm
kernel took 0.25-0.30 us longer into a new tensor than into a fixed one
(kernel_outside_op.py). This times PyTorch's own copy both ways over a range of sizes:
- copy_ into a fixed buffer:  dst.copy_(src);
- clone:                      src.clone() (a new tensor each call);
- copy_ into a new tensor:    torch.empty_like(src).copy_(src).

Usage on a GPU machine: python bench/diagnostics/fresh_output.py [--mb 0.016,1,2,8,22,64,256]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import common  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", default="0.016,1,2,8,22,64,256",
                        help="bytes each copy writes, MB (it reads as many)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us, median of "
          "interleaved calls; each line one set of rounds")
    for mb in (float(v) for v in args.mb.split(",")):
        src = torch.randn(max(1, int(mb * 1e6) // 2), device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        fns = {
            "copy_ into a fixed buffer": lambda: dst.copy_(src),
            "clone": lambda: src.clone(),
            "copy_ into a new tensor": lambda: torch.empty_like(src).copy_(src),
        }
        for round_index in range(args.rounds):
            times = common.bench_side_by_side(fns)
            print(f"{mb:g} MB, round {round_index}: " + ", ".join(
                f"{name} {ms * 1e3:.2f}" for name, ms in times.items()))


if __name__ == "__main__":
    main()
