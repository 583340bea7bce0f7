"""bench/headroom.py's reading of recorded results (no GPU needed): the measured mean over the
best peer, kiln's time over a same-size copy's, the ceiling if kiln took the copy's time, and
which records a later file replaces."""

import json
import math

import pytest
from bench_scripts import load_bench


def _headroom():
    return load_bench("headroom")


def _record(rows, hidden, kiln, compiled, eager, copy):
    return {"op": "rms_norm", "rows": rows, "hidden": hidden,
            "us": {"kiln": kiln, "compiled": compiled, "eager": eager}, "copy_same_bytes_us": copy}


def _write(tmp_path, name, records):
    path = tmp_path / name
    path.write_text(json.dumps({"environment": {}, "results": records}))
    return str(path)


def test_summary_against_the_best_peer_and_the_copy():
    headroom = _headroom()
    records = [_record(1, 2048, 5.0, 6.0, 9.0, 4.0), _record(128, 2048, 8.0, 7.0, 6.4, 6.0)]
    shapes, measured, over_copy, ceiling, needed = headroom.summary(records, 1.2)
    assert shapes == "2"
    # The best peer is the faster of the two each time: compiled 6.0, then eager 6.4.
    assert measured == f"{math.sqrt(6.0 / 5.0 * 6.4 / 8.0):.3f}x"
    assert over_copy == f"{math.sqrt(5.0 / 4.0 * 8.0 / 6.0):.3f}"
    ceiling_value = math.sqrt(6.0 / 4.0 * 6.4 / 6.0)
    assert ceiling == f"{ceiling_value:.3f}x"
    assert needed == f"{ceiling_value / 1.2:.3f}"


def test_a_later_file_replaces_the_same_shapes_and_a_selector_keeps_its_rows(tmp_path):
    headroom = _headroom()
    old = _write(tmp_path, "old.json", [_record(1, 2048, 9.0, 6.0, 9.0, 4.0),
                                        _record(8192, 2048, 70.0, 75.0, 90.0, 69.0)])
    new = _write(tmp_path, "new.json", [_record(1, 2048, 5.0, 6.0, 9.0, 4.0),
                                        _record(8192, 2048, 99.0, 75.0, 90.0, 69.0)])
    records = headroom.load([old, new + ":rows=1"])
    kiln_by_rows = {r["rows"]: r["us"]["kiln"] for r in records}
    assert kiln_by_rows == {1: 5.0, 8192: 70.0}


def test_bad_sources_name_what_is_wrong(tmp_path):
    headroom = _headroom()
    with pytest.raises(SystemExit, match="PATH:FIELD=VALUE"):
        headroom.load([str(tmp_path / "x.json") + ":rows"])
    with pytest.raises(SystemExit, match="cannot read"):
        headroom.load([str(tmp_path / "missing.json")])
    no_copy = _write(tmp_path, "no_copy.json", [{"op": "rms_norm", "rows": 1, "us": {"kiln": 1.0, "eager": 2.0}}])
    with pytest.raises(SystemExit, match="no same-size copy time"):
        headroom.load([no_copy])
