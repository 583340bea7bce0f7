"""For the GPU tests of config variants that only a full tune measures (the norms'
re-read rows, rows staged in shared memory, the RoPE kernels' persistent grids): run a test's child process with its own cache
and tune mode, and pin each tuned problem to the fastest measured config of a variant, after
checking that the tuner measured some and that every one passed its check against the
heuristic's output."""

import json
import os
import pathlib
import subprocess
import sys

import kiln

TESTS = pathlib.Path(__file__).resolve().parent


def run_child(code, args, cache, tune):
    """Runs `code` in a fresh interpreter (no kernel loaded yet) with KILN_CACHE_DIR=cache
    and KILN_TUNE=tune; it must exit 0 and print "ok"."""
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), KILN_TUNE=tune,
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code, *args], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]


def config_key(config):
    """A trial's config as the cache and `kiln.tune_pin` name it (v16.t256.c256.stage=1)."""
    key = f"v{config['vec_bytes']}.t{config['threads_per_row']}.c{config['cta_threads']}"
    return key + "".join(f".{k}={v}" for k, v in sorted(config.get("extra", {}).items()))


def pin_fastest_variant(cache, extra, skip=None):
    """For every tune record under `cache` (but those whose problem key contains `skip`): the
    trials whose config sets `extra` (to anything but 0: reread=1, stage=1, grid=N) were
    measured and all ran ok; pins the problem's bucket to the fastest of them."""
    records = [path for path in (pathlib.Path(cache) / "v1" / "tune").glob("*/*.json")
               if skip is None or skip not in path.name]
    assert records, "the full tune stored nothing"
    for path in records:
        record = json.loads(path.read_text())
        variants = [t for t in record["trials"] if t["config"].get("extra", {}).get(extra, 0) != 0]
        assert variants, f"{path.name}: no {extra} candidate was measured"
        failed = [(config_key(t["config"]), t["status"], t["message"]) for t in variants
                  if t["status"] != "ok"]
        assert not failed, f"{path.name}: {failed}"
        fastest = min(variants, key=lambda t: t["median_us"])
        problem, bucket = path.stem.rsplit(".r", 1)
        kiln.tune_pin(problem=problem, bucket=int(bucket), config=config_key(fastest["config"]),
                      cache_dir=str(cache))


def tune_pin_and_check(code, args, cache, extra, skip=None):
    """Runs `code` with `args` + ["tune"] under a full tune, pins every tuned problem (but
    `skip`'s) to its fastest config with `extra` set, then runs it again with `args` +
    ["check", "<extra>=1"] under the fast tune, which loads the pinned configs."""
    run_child(code, args + ["tune"], cache, "full")
    pin_fastest_variant(cache, extra, skip=skip)
    run_child(code, args + ["check", f"{extra}=1"], cache, "fast")


def check_every_pinned_config(cache, checks, least=20):
    """In a child that has just tuned in full (each of `checks`, keyed by the problem key's
    flags field, "f304", tuned its problem): every trial of every record ran ok, at least
    `least` configs were measured, and each config, pinned in turn with the kernels forgotten,
    passes its problem's check and is the kernel loaded. Returns how many were pinned."""
    records = sorted((pathlib.Path(cache) / "v1" / "tune").glob("*/*.json"))
    assert len(records) == len(checks), records
    pinned = 0
    for path in records:
        record = json.loads(path.read_text())
        problem, bucket = path.stem.rsplit(".r", 1)
        check = checks[problem.split(".")[3]]
        failed = [(config_key(t["config"]), t["message"]) for t in record["trials"]
                  if t["status"] != "ok"]
        assert not failed, failed
        configs = {config_key(t["config"]) for t in record["trials"]}
        assert len(configs) >= least, len(configs)
        for config in sorted(configs):
            kiln.tune_pin(problem=problem, bucket=int(bucket), config=config, cache_dir=str(cache))
            kiln._C.forget_kernels()
            check()
            loaded = [k["config"] for k in kiln._C.loaded_kernels()]
            assert loaded == [config], (config, loaded)
            pinned += 1
    return pinned
