"""NVRTC compiles with no GPU: every RMSNorm specialisation class for sm_75, sm_80, sm_90,
through the disk cache."""

import pytest

import kiln


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("hidden,weight", [(4096, True), (4545, False), (768, True)])
def test_compile_to_ptx(arch, dtype, hidden, weight):
    result = kiln.compile("rms_norm", dtype, hidden, arch=arch, weight=weight, format="ptx")
    ptx = result["binary"].decode()
    assert f".target {arch}" in ptx
    assert result["lowered_name"] and f".entry {result['lowered_name']}" in ptx
    assert f", {hidden}," in result["name_expression"]


def test_second_compile_is_a_cache_hit(tmp_path):
    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path))
    try:
        first = kiln.compile("rms_norm", "bf16", 2048, arch="sm_90", format="cubin")
        second = kiln.compile("rms_norm", "bf16", 2048, arch="sm_90", format="cubin")
        assert not first["from_cache"] and first["compile_ms"] > 0
        assert second["from_cache"] and second["binary"] == first["binary"]
        assert second["lowered_name"] == first["lowered_name"]
        assert list(tmp_path.rglob(f"{first['key']}.bin"))
    finally:
        kiln.configure(cache_dir=before["cache_dir"])


def test_strict_cache_miss_names_the_specialisation(tmp_path):
    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path), cache="strict")
    try:
        with pytest.raises(RuntimeError, match=r"rms_norm\.bf16\.h3072"):
            kiln.compile("rms_norm", "bf16", 3072, arch="sm_90")
    finally:
        kiln.configure(cache_dir=before["cache_dir"], cache=before["cache_mode"])


def test_explicit_config():
    config = {"vec_bytes": 8, "threads_per_row": 64, "cta_threads": 256}
    result = kiln.compile("rms_norm", "bf16", 4096, arch="sm_80", config=config)
    assert "8, 64, 256" in result["name_expression"]
    with pytest.raises(ValueError, match="config"):
        kiln.compile("rms_norm", "bf16", 4096, arch="sm_80",
                     config={"vec_bytes": 32, "threads_per_row": 64, "cta_threads": 256})


@pytest.mark.parametrize("arch,sm_count", [("sm_75", 40), ("sm_80", 108), ("sm_90", 132)])
def test_rows_pick_the_heuristic_for_their_bucket(arch, sm_count):
    """Without a config, `rows` gives the heuristic KILN_TUNE=off serves calls of that many
    rows: the norms' latency config (one row a CTA) for at most one row per SM of the arch's
    typical part, the row-blind heuristic past it."""
    def config(**kwargs):
        return kiln.compile("rms_norm", "bf16", 4096, arch=arch, **kwargs)["config"]

    row_blind = config()
    latency = config(rows=1)
    vec, tpr, cta = latency.split(".")
    assert latency != row_blind and tpr[1:] == cta[1:]  # "v16.t256.c256": one row a CTA
    one_wave = 1 << (sm_count.bit_length() - 1)  # the largest bucket of at most sm_count rows
    assert config(rows=one_wave) == latency
    assert config(rows=one_wave + 1) == row_blind
    assert config(rows=1 << 20) == row_blind
    # a family whose heuristic does not depend on rows
    assert (kiln.compile("swiglu", "bf16", 14336, arch=arch, flags=1, rows=1)["config"]
            == kiln.compile("swiglu", "bf16", 14336, arch=arch, flags=1)["config"])


def test_rows_are_checked():
    with pytest.raises(ValueError, match="rows: expected at least 1, got 0"):
        kiln.compile("rms_norm", "bf16", 4096, arch="sm_90", rows=0)
    config = {"vec_bytes": 16, "threads_per_row": 128, "cta_threads": 128}
    with pytest.raises(ValueError, match="rows: expected no row count with a config"):
        kiln.compile("rms_norm", "bf16", 4096, arch="sm_90", config=config, rows=8)
