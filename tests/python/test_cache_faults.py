"""Fault tests of the disk cache, with no GPU (offline compiles for sm_80): damaged entries,
many processes compiling the same kernels at once, and caches that cannot be written."""

import hashlib
import json
import os
import resource
import subprocess
import sys
import time

import pytest

import kiln
from cache_helpers import entry_files, run_kiln

ARCH = "sm_80"


@pytest.fixture
def fresh_cache(tmp_path):
    before = kiln.settings()
    cache = tmp_path / "cache"
    kiln.configure(cache_dir=str(cache), cache="rw")
    yield cache
    kiln.configure(cache_dir=before["cache_dir"], cache=before["cache_mode"])


def damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "bit-flipped":
        flipped = bytearray(data)
        flipped[len(flipped) - 100] ^= 0x04
        path.write_bytes(bytes(flipped))
    elif how == "zero-length":
        path.write_bytes(b"")
    elif how == "header":
        path.write_bytes(b"KILNBIX" + data[7:])


@pytest.mark.parametrize("how", ["truncated", "bit-flipped", "zero-length", "header"])
def test_damaged_entry_is_detected_counted_moved_aside_and_rebuilt(fresh_cache, how):
    first = kiln.compile("rms_norm", "bf16", 3000, arch=ARCH, format="cubin")
    (entry,) = entry_files(fresh_cache)
    damage(entry, how)
    before = kiln.stats()
    again = kiln.compile("rms_norm", "bf16", 3000, arch=ARCH, format="cubin")
    after = kiln.stats()
    assert after["corrupt"] == before["corrupt"] + 1
    assert not again["from_cache"], "a damaged entry must never be used"
    assert after["nvrtc_compiles"] == before["nvrtc_compiles"] + 1
    assert again["binary"] == first["binary"]
    assert list(entry.parent.glob(entry.name + ".corrupt.*")), "moved aside for inspection"
    third = kiln.compile("rms_norm", "bf16", 3000, arch=ARCH, format="cubin")
    assert third["from_cache"] and third["binary"] == first["binary"], "rebuilt entry is served"
    assert kiln.cache_stats(str(fresh_cache))["corrupt"] >= 1
    print(f"{how} entry: detected, moved aside, rebuilt")


PROCESS_COUNT = 8
KERNELS = [(dtype, hidden) for dtype in ("bf16", "fp16") for hidden in
           (512, 768, 1000, 1536, 2048, 2560, 3072, 4096, 5120, 8192)]

WORKER = """
import hashlib, json, os, random, sys, time
import kiln
kernels = json.loads(os.environ["KERNELS"])
random.Random(int(os.environ["SEED"])).shuffle(kernels)
while not os.path.exists(os.environ["GO"]):   # start together, after the imports
    time.sleep(0.005)
out = {}
for dtype, hidden in kernels:
    r = kiln.compile("rms_norm", dtype, hidden, arch="sm_80", format="cubin")
    out[f"{dtype}.{hidden}"] = hashlib.sha256(r["binary"]).hexdigest()
s = kiln.stats()
print(json.dumps({"hashes": out, "compiles": s["nvrtc_compiles"], "lock_waits": s["lock_waits"]}))
"""


def test_eight_processes_twenty_kernels_each_compiled_once(tmp_path):
    cache = tmp_path / "shared"
    go = tmp_path / "go"
    env = dict(os.environ, KILN_CACHE_DIR=str(cache), KERNELS=json.dumps(KERNELS), GO=str(go))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], env=dict(env, SEED=str(i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(PROCESS_COUNT)]
    time.sleep(0.5)
    go.write_text("go")
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        assert "error" not in err.lower(), err
        results.append(json.loads(out.strip().splitlines()[-1]))
    compiles = sum(r["compiles"] for r in results)
    waits = sum(r["lock_waits"] for r in results)
    assert compiles == len(KERNELS), f"{compiles} compiles for {len(KERNELS)} kernels"
    assert kiln.cache_stats(str(cache))["compiles"] == len(KERNELS)
    assert all(r["hashes"] == results[0]["hashes"] for r in results)
    assert len(entry_files(cache)) == len(KERNELS)
    print(f"{PROCESS_COUNT} processes x {len(KERNELS)} kernels: {compiles} compiles in all, "
          f"{waits} lock waits, 0 errors")


COMPILE_THREE = """
import hashlib, json
import kiln
out = []
for hidden in (1024, 1280, 1792):
    r = kiln.compile("rms_norm", "bf16", hidden, arch="sm_80", format="cubin")
    out.append(hashlib.sha256(r["binary"]).hexdigest())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def reference_hashes(tmp_path_factory):
    code, hashes, err = run_kiln(COMPILE_THREE, tmp_path_factory.mktemp("ref"))
    assert code == 0, err
    return hashes


def cannot_store_lines(stderr):
    return [line for line in stderr.splitlines() if "cannot store" in line]


def test_uncreatable_cache_dir_still_compiles_and_says_so_once(tmp_path, reference_hashes):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, hashes, err = run_kiln(COMPILE_THREE, blocker / "cache")
    assert code == 0, err
    assert hashes == reference_hashes
    assert len(cannot_store_lines(err)) == 1, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a read-only mode bit")
def test_read_only_cache_dir_serves_entries_and_says_once_what_it_could_not_store(
        tmp_path, reference_hashes):
    cache = tmp_path / "ro"
    code, _, err = run_kiln(COMPILE_THREE.replace("(1024, 1280, 1792)", "(1024,)"), cache)
    assert code == 0, err
    before = {p: p.read_bytes() for p in entry_files(cache)}
    for folder in [cache, *[p for p in cache.rglob("*") if p.is_dir()]]:
        folder.chmod(0o555)
    try:
        code, hashes, err = run_kiln(COMPILE_THREE, cache)
    finally:
        for folder in [cache, *[p for p in cache.rglob("*") if p.is_dir()]]:
            folder.chmod(0o755)
    assert code == 0, err
    assert hashes == reference_hashes
    assert len(cannot_store_lines(err)) == 1, err
    assert {p: p.read_bytes() for p in entry_files(cache)} == before


def test_ro_mode_never_writes(tmp_path, reference_hashes):
    cache = tmp_path / "ro-mode"
    code, hashes, err = run_kiln(COMPILE_THREE, cache, {"KILN_CACHE": "ro"})
    assert code == 0, err
    assert hashes == reference_hashes
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_file_size_limit_keeps_results_correct_and_loses_nothing(tmp_path, reference_hashes):
    cache = tmp_path / "full"
    code, _, err = run_kiln(COMPILE_THREE.replace("(1024, 1280, 1792)", "(1024,)"), cache)
    assert code == 0, err
    before = {p: p.read_bytes() for p in entry_files(cache)}
    assert before

    def limit_file_size():
        # Smaller than any cubin entry: every new store fails with EFBIG (not SIGXFSZ).
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))

    code, hashes, err = run_kiln(COMPILE_THREE, cache, preexec_fn=limit_file_size)
    assert code == 0, f"killed or failed (code {code}): {err}"
    assert hashes == reference_hashes
    assert len(cannot_store_lines(err)) == 1, err
    assert "File too large" in err
    after = {p: p.read_bytes() for p in entry_files(cache)}
    assert after == before, "entries already stored are untouched"
    assert not list(cache.rglob(".*.tmp.*")), "no temp file left behind"
