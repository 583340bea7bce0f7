"""bench/copy_floor.py's reading of its own measurements (no GPU needed): the size from which
a fraction of the 1 GiB copy holds, and the markdown that states it."""

from bench_scripts import load_bench


def _copy_floor():
    return load_bench("copy_floor")


def _row(mb, copy_pct, elementwise_pct, sustained=(0, 0)):
    return {"moved_mb": mb, "copy_us": 1.0, "copy_pct_of_copy": copy_pct,
            "elementwise_us": 1.0, "elementwise_pct_of_copy": elementwise_pct, "launch_us": 4.0,
            "reads2_us": 1.5, "reads2_pct_of_copy": elementwise_pct - 1,
            "reads3_us": 1.75, "reads3_pct_of_copy": elementwise_pct - 3,
            "copy_sustained_us": 2.0, "copy_sustained_pct_of_copy": sustained[0],
            "elementwise_sustained_us": 3.0, "elementwise_sustained_pct_of_copy": sustained[1]}


def test_reached_from_the_first_size_after_which_it_always_holds():
    floor = _copy_floor()
    rows = [_row(20, 40, 49), _row(88, 73, 81), _row(128, 78, 79), _row(176, 85, 90), _row(264, 89, 92)]
    # 88 MB reaches 80% but 128 MB falls below it again, so 80% holds only from 176 MB.
    assert floor.first_size_reaching(rows, 0.80) == 176
    # The better of the two kernels counts: 90% holds from 176 MB through the elementwise one.
    assert floor.first_size_reaching(rows, 0.90) == 176
    assert floor.first_size_reaching(rows, 0.95) is None


def test_sustained_reading_uses_the_sustained_columns():
    floor = _copy_floor()
    rows = [_row(20, 40, 49, (47, 60)), _row(88, 73, 81, (79, 87)), _row(128, 78, 79, (90, 90))]
    assert floor.first_size_reaching(rows, 0.80) is None
    assert floor.first_size_reaching(rows, 0.80, "_sustained") == 88
    assert floor.first_size_reaching(rows, 0.90, "_sustained") == 128
    assert floor.first_size_reaching(rows, 0.95, "_sustained") is None


def test_markdown_states_each_target():
    floor = _copy_floor()
    env = {"device": "GPU", "sm": "sm_90", "date": "2026-11-23", "versions": {"torch": "2"},
           "driver": "1", "timing": "events"}
    text = floor.markdown(env, 4250.0, 4246.0, [_row(88, 73, 81, (79, 87)), _row(264, 89, 96, (92, 95))])
    assert "| 88 | 1.00 (73%) | 1.00 (81%) | 1.50 (80%) | 1.75 (78%) | 4.00 | 2.00 (79%) | 3.00 (87%) |" in text
    assert "- 80% of the 1 GiB copy: reached, single calls from 88 MB; sustained from 88 MB." in text
    assert "- 90% of the 1 GiB copy: reached, single calls from 264 MB; sustained from 264 MB." in text
    assert "- 95% of the 1 GiB copy: reached, single calls from 264 MB; sustained from 264 MB." in text
    assert "4246 GB/s sustained" in text
