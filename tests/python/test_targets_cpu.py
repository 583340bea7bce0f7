"""bench/targets.py's reading of recorded results against the issues' targets (no GPU
needed): the bandwidth lines against the 1 GiB copy and the same-size copy, never slower and
strictly faster, the geometric mean, and the launch-bound activations' two timings."""

import json
import math

import pytest
from bench_scripts import load_bench


def _targets():
    return load_bench("targets")


def _record(mb, kiln_us, peer_us, copy_us, pct, **shape):
    """A record of `mb` MB where kiln reaches `pct`% of the 1 GiB copy."""
    record = {"bytes": int(mb * 1e6), "us": {"kiln": kiln_us, "compiled": peer_us},
              "copy_same_bytes_us": copy_us, "pct_of_copy": {"kiln": pct, "compiled": 0.0}}
    record.update(shape or {"op": "rms_norm", "rows": int(mb), "hidden": 4096})
    return record


def test_a_bandwidth_line_counts_kiln_and_where_the_same_size_copy_reaches_it():
    targets = _targets()
    records = [
        _record(30, 10.0, 11.0, 9.0, 85.0),   # kiln 85%, copy 85 * 10 / 9 = 94.4%: both over
        _record(60, 10.0, 11.0, 9.5, 75.0),   # kiln 75%, copy 78.9%: neither
        _record(90, 10.0, 11.0, 9.0, 75.0),   # kiln 75%, copy 83.3%: only the copy
        _record(200, 10.0, 11.0, 10.0, 95.0),  # past the line's range
        _record(10, 10.0, 11.0, 10.0, 95.0),   # under it
    ]
    issue, label, shapes, met, figures = targets.bandwidth_row("3", records, 20, 128, 0.80)
    assert (issue, label, shapes, met) == ("3", ">= 80% of copy, 20-128 MB", "3", "1")
    assert "kiln 75-85%" in figures and "same-size copy 79-94%" in figures
    assert figures.endswith("the copy reaches the line on 2, kiln on 1 of them")
    assert targets.copy_fraction(records[2]) == pytest.approx(0.75 * 10.0 / 9.0)

    _, label, shapes, met, _ = targets.bandwidth_row("3", records, 128, None, 0.90)
    assert (label, shapes, met) == (">= 90% of copy, >= 128 MB", "1", "1")


def test_never_slower_counts_a_tie_and_faster_does_not():
    targets = _targets()
    records = [_record(1, 5.0, 5.0, 4.0, 1.0, op="a", rows=1, hidden=1),
               _record(1, 5.0, 6.0, 4.0, 1.0, op="b", rows=1, hidden=1),
               _record(1, 5.0, 4.0, 4.0, 1.0, op="c", rows=1, hidden=1)]
    _, _, shapes, met, figures = targets.slower_row("3", records, "never slower", False)
    assert (shapes, met) == ("3", "2")
    assert "vs best peer 0.800-1.200x" in figures
    assert "furthest behind: c 1 1 0.800x" in figures
    _, _, _, met, _ = targets.slower_row("4", records, "faster than every peer", True)
    assert met == "1"


def test_the_best_peer_is_the_fastest_of_them():
    targets = _targets()
    record = _record(1, 5.0, 6.0, 4.0, 1.0)
    record["us"]["eager"] = 4.0
    assert targets.speedup(record) == pytest.approx(0.8)


def test_the_geometric_mean_and_its_ceiling():
    targets = _targets()
    records = [_record(1, 5.0, 6.0, 4.0, 1.0, op="a", rows=1, hidden=1),
               _record(1, 8.0, 10.0, 7.0, 1.0, op="b", rows=1, hidden=1)]
    _, label, shapes, met, figures = targets.geomean_row("3", records, 1.2)
    measured = math.sqrt(6.0 / 5.0 * 10.0 / 8.0)
    ceiling = math.sqrt(6.0 / 4.0 * 10.0 / 7.0)
    assert (label, shapes, met) == ("geometric mean >= 1.2x over the best peer", "2", "1")
    assert figures == f"{measured:.3f}x; {ceiling:.3f}x if every call took a same-size copy's time"
    assert targets.geomean_row("3", records, 1.3)[3] == "0"


def test_activations_split_launch_bound_tokens_and_read_the_back_to_back_timing():
    targets = _targets()
    small = _record(0.05, 4.7, 4.6, 4.5, 0.2, form="swiglu", tokens=1, width=8192)
    small["back_to_back_speedup"] = 2.1
    tied = _record(10, 7.0, 7.0, 6.8, 20.0, form="swiglu", tokens=128, width=8192)
    tied["back_to_back_speedup"] = 0.9
    large = _record(200, 50.0, 50.0, 51.0, 90.0, form="swiglu", tokens=4096, width=8192)
    rows = targets.rows_for("activations", [small, tied, large])
    by_label = {row[1]: row for row in rows}
    assert by_label[">= 95% of copy, >= 128 MB"][2:4] == ["1", "0"]
    assert by_label["4096 and 16384 tokens: never slower"][2:4] == ["1", "1"]
    # GPU time: one trails, one ties; neither is faster than both.
    assert by_label["1 and 128 tokens: faster than both (GPU time)"][2:4] == ["2", "0"]
    assert by_label["1 and 128 tokens, called back to back: faster than both"][2:4] == ["2", "1"]
    assert not any("geometric mean" in row[1] for row in rows)


def test_main_reads_files_in_order_and_refuses_no_sources(tmp_path, capsys):
    targets = _targets()
    first = tmp_path / "a.json"
    second = tmp_path / "b.json"
    first.write_text(json.dumps({"results": [_record(200, 10.0, 11.0, 10.0, 80.0)]}))
    # The later file's record of the same shape replaces the first's.
    second.write_text(json.dumps({"results": [_record(200, 10.0, 11.0, 10.0, 95.0)]}))
    assert targets.main(["--norms", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "| 3 | >= 90% of copy, >= 128 MB | 1 | 1 |" in out
    assert "| 3 | never slower than the best peer | 1 | 1 |" in out
    with pytest.raises(SystemExit, match="--norms, --rope or --activations"):
        targets.main([])


def test_a_bad_source_is_named_with_this_tool(tmp_path):
    targets = _targets()
    missing = tmp_path / "missing.json"
    with pytest.raises(SystemExit, match=r"targets: cannot read .*missing\.json"):
        targets.main(["--rope", str(missing)])
