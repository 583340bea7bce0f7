"""bench/libraries.py without a GPU: it skips, saying why, where Liger-Kernel is not
installed, and its tables' geometric means are those of the recorded ratios."""

import json
import math
import sys
import types

from bench_scripts import load_bench


def test_skips_without_liger(capsys, monkeypatch):
    libraries = load_bench("libraries")
    monkeypatch.setattr(libraries, "LIGER", None)
    monkeypatch.setattr(sys, "argv", ["libraries.py", "--quick"])
    libraries.main()
    assert "liger_kernel is not installed" in capsys.readouterr().out


def test_written_tables_and_means(tmp_path, monkeypatch):
    libraries = load_bench("libraries")
    monkeypatch.setattr(libraries.common, "stamp", lambda env: "stamp")

    def record(shape, kiln, liger):
        return {"op": "rms_norm", "pass": "forward", "shape": shape, "bytes": 2e6,
                "us": {"kiln": kiln, "liger": liger}, "copy_same_bytes_us": 1.0,
                "pct_of_copy": {"kiln": 50.0, "liger": 40.0}, "kiln_vs_liger": liger / kiln,
                "rel_diff_kiln_liger": 1e-3}

    results = [record("1x8", 4.0, 5.0), record("2x8", 10.0, 8.0)]
    env = {"versions": {"liger_kernel": "0.0", "torch": "t"}, "device": "d", "sm": "sm_90", "date": "today"}
    args = types.SimpleNamespace(out=str(tmp_path), tag="")
    kiln = types.SimpleNamespace(settings=lambda: {})
    libraries.write(args, env, 4000.0, results, kiln)
    written = json.loads((tmp_path / "libraries-stamp.json").read_text())
    mean = math.sqrt(5.0 / 4.0 * 8.0 / 10.0)
    assert math.isclose(written["geomean_kiln_vs_liger"]["rms_norm forward"], mean)
    table = (tmp_path / "libraries-stamp.md").read_text()
    assert f"| rms_norm | forward | {mean:.2f}x | 0.80x | 1.25x |" in table
    assert "| rms_norm | forward | 2x8 | 2.0 | 10.0 (50%) | 8.0 (40%) | 0.80x | 1.0 | 1.0e-03 |" in table
