"""What a diffusion transformer's first forward costs a deployment that uses kiln, and how fast
the forwards after it run, for FLUX.1-dev, Wan 2.1 1.3B and LTX-Video (random weights, bf16, the
sizes of bench/flux.py, bench/wan.py and bench/ltx_video.py):

- eager: the model without kiln (its first forward pays PyTorch's own start: cuBLAS, cuDNN);
- cold: kiln.patch on an empty cache: each kernel compiled and fast-tuned inside the forward;
- tuned cache: a later process on the cache the cold run filled (binaries and tunes read from
  disk);
- prewarmed: `kiln.prewarm(config=config.json)` run beforehand in a process that sees no GPU,
  then the patched model on that cache: no compile, no tune, each family's heuristic config.

Each mode runs in a process of its own (kiln's loaded kernels and torch's state start empty).
Every output is compared with the eager one. Writes first-forward-<date>-<device><tag>.{json,md}
under --out."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MODELS = ("flux", "wan", "ltx-video")
TIMING = ("first forward: host wall time of a process's first call, the device synchronized before and "
          "after; then: the median of the forwards after it (common.model_times)")
MODES = ("eager", "cold", "tuned cache", "prewarmed")


def build(name, tiny, device):
    """(model, one forward of it returning the output tensor, a description) at the sizes its
    own bench uses by default (with `tiny`, its bench's tiny model and inputs)."""
    what = "tiny " if tiny else ""
    if name == "flux":
        import flux

        model = flux.build_model("dev", tiny=tiny, device=device)
        config = dict(model.config)
        kwargs = flux.build_inputs(config, 1024, 1024, device, tiny)
        what += f"FLUX.1-dev, 1024x1024 ({kwargs['hidden_states'].shape[1]} image tokens)"
    elif name == "wan":
        import wan

        model = wan.build_model("1.3b", tiny=tiny, device=device)
        shape = wan.latent_shape(81, 480, 832, tiny)
        kwargs = wan.inputs(model, shape, device=device)
        what += f"Wan 2.1 1.3B, 81 frames at 480x832 (latent {list(shape)})"
    else:
        import ltx_video

        model = ltx_video.build_model(tiny=tiny, device=device)
        height, width = (64, 96) if tiny else (ltx_video.HEIGHT, ltx_video.WIDTH)
        kwargs = ltx_video.build_inputs(model.config, 49, height, width, device=device)
        what += f"LTX-Video, 49 frames at {height}x{width}, batch {ltx_video.BATCH}"
    return model, lambda: model(**kwargs)[0], what


def config_json(name, tiny, directory):
    """The model's config.json as diffusers writes it (the model built on the meta device)."""
    import flux
    import ltx_video
    import wan
    from diffusers import FluxTransformer2DModel, LTXVideoTransformer3DModel, WanTransformer3DModel

    if name == "flux":
        cls, config = FluxTransformer2DModel, flux.model_config("dev", tiny=tiny)
    elif name == "wan":
        cls, config = WanTransformer3DModel, wan.TINY if tiny else dict(wan.COMMON, **wan.MODELS["1.3b"])
    else:
        cls, config = LTXVideoTransformer3DModel, dict(ltx_video.TINY) if tiny else {}
    with torch.device("meta"):
        cls(**config).save_config(directory)
    return os.path.join(directory, "config.json")


def worker(args):
    """One mode in this process: the first forward's wall time, then the steady forward's."""
    import kiln

    started = time.perf_counter()
    model, forward, what = build(args.model, args.tiny, args.device)
    built_s = time.perf_counter() - started
    if args.worker != "eager":
        kiln.patch(model)
    outputs = []
    with torch.no_grad():
        first_s = common.first_call_ms(lambda: outputs.append(forward())) / 1e3
    out = outputs[0]
    with torch.no_grad():
        # A second of warm-up, as the model benches take: after a cold first forward (seconds of
        # compiling with the GPU mostly idle) half a second left LTX-Video's forwards 16% slow.
        timing = common.model_times(forward, warmup=1, reps=args.reps, warmup_s=1.0)
    torch.save(out.float().cpu(), os.path.join(args.scratch, f"{args.model}-{args.worker}.pt"))
    stats = kiln.stats()
    print(json.dumps({"model": what, "built_s": built_s, "first_forward_s": first_s, "ms": timing["ms"],
                      "nvrtc_compiles": stats["nvrtc_compiles"], "tunes": stats["tunes"],
                      "binary_hits": stats["binary_hits"], "tuning_hits": stats["tuning_hits"]}))


def run(args, mode, cache, extra_env=None):
    env = dict(os.environ, KILN_CACHE_DIR=cache, **(extra_env or {}))
    command = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--model", args.model_name,
               "--scratch", args.scratch, "--device", args.device, "--reps", str(args.reps)]
    if args.tiny:
        command.append("--tiny")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{args.model_name} {mode}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def prewarm(config, cache, arch, jobs):
    """kiln.prewarm of config.json for `arch` in a process that sees no GPU; its summary."""
    code = (f"import json, kiln\nassert kiln.device_count() == 0\n"
            f"print(json.dumps(kiln.prewarm(dtypes='bf16', archs='{arch}', config={config!r}, jobs={jobs})))")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, KILN_CACHE_DIR=cache, CUDA_VISIBLE_DEVICES=""))
    if done.returncode != 0:
        raise RuntimeError(f"prewarm of {config}: {done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    summary["wall_s"] = time.perf_counter() - started
    return summary


def measure_model(args, arch):
    scratch = args.scratch
    config = config_json(args.model_name, args.tiny, tempfile.mkdtemp(dir=scratch))
    cold_cache, prewarm_cache = tempfile.mkdtemp(dir=scratch), tempfile.mkdtemp(dir=scratch)
    record = {"prewarm": prewarm(config, prewarm_cache, arch, args.jobs), "modes": {}}
    for mode in MODES:
        cache = prewarm_cache if mode == "prewarmed" else cold_cache
        worker_mode = {"tuned cache": "cached"}.get(mode, mode)
        if mode == "eager":
            cache = tempfile.mkdtemp(dir=scratch)
        result = run(args, worker_mode, cache)
        out = torch.load(os.path.join(scratch, f"{args.model_name}-{worker_mode}.pt"))
        if mode == "eager":
            reference = out
        else:
            result["error_vs_eager"] = common.relative_errors(out, reference)
        record["modes"][mode] = result
        print(f"  {args.model_name} {mode}: first forward {result['first_forward_s']:.2f} s, then "
              f"{result['ms']:.1f} ms; NVRTC compiles {result['nvrtc_compiles']}, tunes {result['tunes']}",
              flush=True)
    record["model"] = record["modes"]["eager"]["model"]
    return record


def markdown(env, document):
    versions = env["versions"]
    lines = [f"First forward of a diffusion transformer with kiln, {env['device']} ({env['sm']}), "
             f"{env['date']}, torch {versions['torch']}, diffusers {versions.get('diffusers', '-')}; bf16, "
             f"random weights; each mode its own process; {TIMING}.", ""]
    for name, record in document["models"].items():
        warmed = record["prewarm"]
        eager_first = record["modes"]["eager"]["first_forward_s"]
        lines += [f"**{record['model']}**: prewarm with no GPU compiled {warmed['compiled']} binaries in "
                  f"{warmed['wall_s']:.1f} s ({warmed['failed']} failed).", "",
                  "| mode | first forward s | over eager's first s | then ms | NVRTC compiles | tunes | "
                  "max rel err vs eager |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for mode, r in record["modes"].items():
            err = r.get("error_vs_eager")
            over = "-" if mode == "eager" else f"{r['first_forward_s'] - eager_first:+.2f}"
            error = f"{err['max_rel']:.2e}" if err else "-"
            lines.append(f"| {mode} | {r['first_forward_s']:.2f} | {over} | {r['ms']:.2f} | "
                         f"{r['nvrtc_compiles']} | {r['tunes']} | {error} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="", help="appended to the output file names")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="tiny configs of the same structure (a CPU smoke run)")
    parser.add_argument("--reps", type=int, default=3, help="forwards timed after the first")
    parser.add_argument("--quick", action="store_true", help="one forward timed after the first")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="prewarm's compile jobs")
    parser.add_argument("--worker", choices=["eager", "cold", "cached", "prewarmed"], help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.reps = 1
    if args.worker:
        return worker(args)
    import kiln

    started = time.perf_counter()
    env = dict(common.model_environment(args.device), timing=TIMING)
    # On the CPU (a smoke run) the prewarm compiles for sm_90, as a GPU-less build machine would.
    arch = kiln.device_info(0)["arch"] if args.device == "cuda" else "sm_90"
    document = {"environment": env, "dtype": "bf16", "arch": arch, "models": {}}
    with tempfile.TemporaryDirectory(prefix="kiln-first-forward-") as scratch:
        args.scratch = scratch
        for name in args.models.split(","):
            args.model_name = name
            document["models"][name] = measure_model(args, arch)
    table = markdown(env, document)
    common.finish_model_bench(args, "first-forward", env, document, table, started)
    return document


if __name__ == "__main__":
    main()
