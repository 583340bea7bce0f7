"""kiln::rope_flat against kiln::rope on the vision towers' rotations whose halves are not whole
16-byte vectors (Qwen3-VL's 72-wide heads, MiniMax-M3-VL's 78 of 80): a full tune of each call
(every config timed on the tuner's stand-alone run), its fastest configs of each kernel listed,
then the fastest of each pinned in turn and the call itself timed beside torch.compile of
transformers' function and a copy of the same bytes (interleaved rounds, bench_side_by_side).

Usage: python bench/diagnostics/rope_flat_configs.py   (GPU)
       ncu --profile-from-start off --clock-control none --cache-control all [--metrics ...] \
           python bench/diagnostics/rope_flat_configs.py --profile
With --profile, after the tunes each case's fastest config of each kernel is called once
(pinned in turn), then torch.compile's kernel and a negation of the same q and k, between
cudaProfilerStart and Stop, and nothing is timed."""

import json
import os
import sys

os.environ["KILN_TUNE"] = "full"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import common  # noqa: E402
import vision_rope as bench  # noqa: E402

kiln = common.fresh_kiln()
import torch  # noqa: E402
from kiln.patching.vision_rope import compare, vision_rope  # noqa: E402

BF16 = torch.bfloat16


def key(config):
    text = f"v{config['vec_bytes']}.t{config['threads_per_row']}.c{config['cta_threads']}"
    return text + "".join(f".{k}={v}" for k, v in sorted(config.get("extra", {}).items()))


def main():
    profile = "--profile" in sys.argv
    seen = set()
    for name, patches, head_dim, model in (("Qwen3-VL 1024x1024", 4096, 72, "qwen2_5_vl"),
                                           ("Qwen3-VL video", 8192, 72, "qwen2_5_vl"),
                                           ("MiniMax-M3-VL 1008x1008", 5184, 80, "minimax_m3_vl")):
        if profile and "video" in name:
            continue
        apply = bench.vision_apply(model)
        form, _ = compare(apply)
        patched, compiled = vision_rope(apply, form), torch.compile(apply, dynamic=False)
        if model == "minimax_m3_vl":
            q, k = bench.separate_qk(patches, head_dim)
            cos, sin = bench.table(patches, head_dim, rotated=bench.MINIMAX_ROTATED, dtype=BF16)
        else:
            q, k = bench.packed_qk(patches, head_dim)
            cos, sin = bench.table(patches, head_dim)
        moved = 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * cos.element_size()
        patched(q, k, cos, sin)
        records = common.tuned_configs(common.tune_dir(kiln), seen)
        print(f"## {name}: {list(records)}")
        for file in records:
            record = json.load(open(os.path.join(common.tune_dir(kiln), file)))
            trials = sorted((t for t in record["trials"] if t["status"] == "ok"), key=lambda t: t["median_us"])
            flat = [t for t in trials if "flat" in t["config"].get("extra", {})]
            pair = [t for t in trials if "flat" not in t["config"].get("extra", {})]
            print(f"{len(trials)} configs; fastest pair: " + ", ".join(
                f"{key(t['config'])} {t['median_us']:.2f}" for t in pair[:4]))
            print("fastest flat: " + ", ".join(f"{key(t['config'])} {t['median_us']:.2f}" for t in flat[:6]))
            problem, bucket = file[:-len(".json")].rsplit(".r", 1)
            if profile:
                both = torch.cat([q.flatten(), k.flatten()])
                negated = torch.empty_like(both)
                compiled(q, k, cos, sin)
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
            for label, trial in (("pair", pair[0]), ("flat", flat[0] if flat else None)):
                if trial is None:
                    continue
                kiln.tune_pin(problem=problem, bucket=int(bucket), config=key(trial["config"]))
                kiln._C.forget_kernels()
                patched(q, k, cos, sin)
                if profile:
                    continue
                times = common.bench_side_by_side({
                    "kiln": lambda: patched(q, k, cos, sin),
                    "compiled": lambda: compiled(q, k, cos, sin),
                    "copy": common.same_bytes_copy(moved)})
                print(f"{label} {key(trial['config'])}: " + ", ".join(
                    f"{n} {t * 1e3:.2f} us" for n, t in times.items())
                    + f"; kiln / compiled {times['kiln'] / times['compiled']:.3f}, kiln / copy "
                      f"{times['kiln'] / times['copy']:.3f}", flush=True)
            if profile:
                compiled(q, k, cos, sin)
                torch.neg(both, out=negated)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
