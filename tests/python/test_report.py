"""kiln report and kiln tune export/import, from Python and from the CLI, over a hand-written
tuning database (tuning_fixture.py); no GPU needed."""

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

import kiln
from test_prewarm import kiln_cli
from tuning_fixture import (H100, H200, RMS_NORM_BYTES, RMS_NORM_KEY, SWIGLU_KEY, config,
                            document, make_database, rms_norm_document, trial, write)

VOID = {"meta", "br", "img", "input", "link", "hr"}


class StrictTree(HTMLParser):
    """Records the element structure and fails on a close tag that does not match."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.counts, self.errors, self.attrs = [], {}, [], []
        self.text = []

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        self.attrs.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        self.attrs.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse_html(text):
    tree = StrictTree()
    tree.feed(text)
    tree.close()
    assert not tree.errors, tree.errors[:5]
    assert not tree.stack, f"unclosed: {tree.stack}"
    return tree


@pytest.fixture
def database(tmp_path):
    return make_database(tmp_path / "db")


def test_report_json_schema_and_numbers(database):
    model = json.loads(kiln.report("json", cache_dir=str(database)))
    assert model["schema"] == "kiln.report" and model["version"] == 1
    assert model["total_results"] == 3
    assert model["total_tune_ms"] == pytest.approx(2100.0)
    assert [d["device"] for d in model["devices"]] == [H100, H200]
    h100, h200 = model["devices"]
    assert h100["copy_bandwidth_gbs"] == pytest.approx(3000.0)
    assert h200["copy_bandwidth_gbs"] is None
    assert (h100["sm_count"], h100["driver"], h100["nvrtc"]) == (132, "13.0", "12.8")
    rms = h100["results"][0]
    assert rms["problem_key"] == RMS_NORM_KEY and rms["bytes_moved"] == RMS_NORM_BYTES
    winner = next(c for c in rms["candidates"] if c["is_winner"])
    assert winner["achieved_gbs"] == pytest.approx(RMS_NORM_BYTES / 32e-6 / 1e9)
    assert winner["percent_of_copy"] == pytest.approx(100 * RMS_NORM_BYTES / 32e-6 / 1e9 / 3000)
    assert rms["speedup_over_heuristic"] == pytest.approx(40.0 / 32.0)
    assert [c["status"] for c in rms["candidates"]][3:] == ["resource_error", "wrong_result"]
    assert all(c["percent_of_copy"] is None for c in h200["results"][0]["candidates"])
    assert [s["device"] for s in model["skipped"]] == ["prewarm-sm_90"]


def test_report_filters(database):
    only_swiglu = json.loads(kiln.report("json", op="swiglu", cache_dir=str(database)))
    assert only_swiglu["total_results"] == 1
    assert only_swiglu["devices"][0]["results"][0]["problem_key"] == SWIGLU_KEY
    only_h200 = json.loads(kiln.report("json", device="H200", cache_dir=str(database)))
    assert [d["device"] for d in only_h200["devices"]] == [H200]
    with pytest.raises(ValueError, match="kiln.report: op: expected a known op name"):
        kiln.report("json", op="rmsnorm", cache_dir=str(database))
    with pytest.raises(ValueError, match="kiln.report: format"):
        kiln.report("pdf", cache_dir=str(database))


def test_report_markdown_tables(database):
    md = kiln.report("md", cache_dir=str(database))
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(rows) == 5 + 2 + 5  # every candidate of every result
    assert "| `v16.t64.c256` | ok | 32.00 | 0.20 | 2097.4 | 69.9 | 130 | winner |" in md
    assert "| `v16.t64.c256` | ok | 32.00 | 0.20 | 2097.4 | – | 130 | winner |" in md  # H200


def test_report_html_is_well_formed_and_self_contained(database):
    html = kiln.report("html", cache_dir=str(database))
    tree = parse_html(html)
    assert tree.counts["svg"] == 3 and tree.counts["html"] == 1
    assert "script" not in tree.counts
    bars = [a for tag, a in tree.attrs if tag == "rect" and "bar" in a.get("class", "")]
    assert len(bars) == 3 + 2 + 3
    rooflines = [a for tag, a in tree.attrs if tag == "line" and a.get("class") == "roofline"]
    assert [r["data-gbs"] for r in rooflines] == ["3000.0", "3000.0"]  # the H100's results only
    for tag, attrs in tree.attrs:
        for name, value in attrs.items():
            assert name not in ("src", "href"), (tag, name, value)
    assert "too many registers <spill> & more" in "".join(tree.text)


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.skipif(chromium() is None, reason="no chromium to render the page headless")
def test_report_html_renders_in_a_headless_browser(database, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(kiln.report("html", cache_dir=str(database)))
    out = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    tree = parse_html(out.stdout)  # the DOM as the browser built it
    assert tree.counts["svg"] == 3
    assert len([a for tag, a in tree.attrs if tag == "rect" and "bar" in a.get("class", "")]) == 8
    assert tree.counts["table"] == 1 + 3 + 1  # devices, one per measured result, skipped


def test_export_import_round_trip(database, tmp_path):
    bundle, other = tmp_path / "tune.json", tmp_path / "other"
    exported = kiln.tune_export(str(bundle), cache_dir=str(database))
    assert exported["exported"] == 4 and exported["skipped_invalid"] == 0  # incl. prewarm
    data = json.loads(bundle.read_text())
    assert data["format"] == "kiln.tune-bundle" and data["version"] == 1
    imported = kiln.tune_import(str(bundle), cache_dir=str(other))
    assert (imported["imported"], imported["skipped_invalid"], imported["failed"]) == (4, 0, 0)
    assert (json.loads(kiln.report("json", cache_dir=str(other))) ==
            json.loads(kiln.report("json", cache_dir=str(database))))
    for path in database.rglob("*.json"):
        copy = other / path.relative_to(database)
        assert json.loads(copy.read_text()) == json.loads(path.read_text())

    only_h200 = tmp_path / "h200.json"
    assert kiln.tune_export(str(only_h200), device=H200, cache_dir=str(database))["exported"] == 1
    assert [e["device"] for e in json.loads(only_h200.read_text())["entries"]] == [H200]


def test_export_skips_damaged_documents(database, tmp_path):
    write(database, H200, SWIGLU_KEY, 64, "{ not json")
    result = kiln.tune_export(str(tmp_path / "b.json"), cache_dir=str(database))
    assert (result["exported"], result["skipped_invalid"]) == (4, 1)
    assert "not valid JSON" in result["problems"][0]


def test_import_validates_each_entry(database, tmp_path):
    bundle = tmp_path / "tune.json"
    kiln.tune_export(str(bundle), cache_dir=str(database))
    data = json.loads(bundle.read_text())
    good = data["entries"][0]
    assert good["device"] == H100

    def variant(**changes):
        entry = json.loads(json.dumps(good))
        for key, value in changes.items():
            if key == "document":
                entry["document"].update(value)
            else:
                entry[key] = value
        return entry

    bad_trials = variant(document={"trials": [{"config": {}, "status": "ok"}]})
    no_fingerprint = variant()
    del no_fingerprint["document"]["device"]["fingerprint"]
    data["entries"] += [
        variant(problem="rms_norm.bf16.h2048.f1.a16"),   # key disagrees with the document
        variant(bucket=2048),                              # bucket disagrees
        variant(device=H200),                              # measured on another device
        variant(device="../escape"),                       # not a folder name
        variant(document={"problem": {**good["document"]["problem"], "op": "no_such_op"}}),
        variant(document={"mode": "sometimes"}),
        bad_trials,
        no_fingerprint,
        "not an entry",
    ]
    bundle.write_text(json.dumps(data))
    result = kiln.tune_import(str(bundle), cache_dir=str(tmp_path / "other"))
    assert (result["imported"], result["skipped_invalid"]) == (4, 9)
    reasons = "\n".join(result["problems"])
    for fragment in ("problem key", "bucket", "device", "folder name", "no_such_op", "mode",
                     "trials[0]", "fingerprint", "expected an object"):
        assert fragment in reasons
    assert len(list((tmp_path / "other").rglob("*.json"))) == 4


@pytest.mark.parametrize("text, message", [
    ("{ nope", "is not valid JSON"),
    ('{"format": "something else", "version": 1, "entries": []}', '"format"'),
    ('{"format": "kiln.tune-bundle", "version": 2, "entries": []}', '"version": expected 1'),
    ('{"format": "kiln.tune-bundle", "version": 1, "entries": {}}', '"entries"'),
])
def test_import_rejects_a_file_that_is_not_a_bundle(tmp_path, text, message):
    bundle = tmp_path / "bad.json"
    bundle.write_text(text)
    with pytest.raises(RuntimeError, match=message):
        kiln.tune_import(str(bundle), cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "c" / "v1" / "tune").exists()
    with pytest.raises(RuntimeError, match="no such file"):
        kiln.tune_import(str(tmp_path / "missing.json"), cache_dir=str(tmp_path / "c"))


@pytest.mark.skipif(kiln_cli() is None,
                    reason="no kiln command of this build (set KILN_CLI or put it on PATH)")
def test_cli_report_and_tune(database, tmp_path):
    cli = kiln_cli()

    def run(*args):
        env = dict(os.environ, KILN_CACHE_DIR=str(database))
        return subprocess.run([cli, *args], env=env, capture_output=True, text=True, timeout=120)

    out = run("report", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(kiln.report("json", cache_dir=str(database)))
    page = tmp_path / "r.html"
    out = run("report", "--format", "html", "-o", str(page), "--op", "rms_norm", "--device", H100)
    assert out.returncode == 0, out.stderr
    assert page.read_text() == kiln.report("html", device=H100, op="rms_norm",
                                           cache_dir=str(database))
    parse_html(page.read_text())
    md = run("report", "--format", "md", "--cache-dir", str(database)).stdout
    assert md == kiln.report("md", cache_dir=str(database))
    assert run("report", "--format", "pdf").returncode != 0
    bad_op = run("report", "--format", "md", "--op", "rmsnorm")
    assert bad_op.returncode == 2 and "kiln.report: op: expected a known op name" in bad_op.stderr

    bundle, other = tmp_path / "b.json", tmp_path / "other"
    out = run("tune", "export", str(bundle), "--device", "H100")
    assert out.returncode == 0, out.stderr
    assert "exported 2 tuning results (0 invalid and skipped, 0 not stored)" in out.stdout
    out = run("tune", "--cache-dir", str(other), "import", str(bundle))
    assert out.returncode == 0, out.stderr
    assert "imported 2 tuning results" in out.stdout
    assert len(list(other.rglob("*.json"))) == 2
    bundle.write_text("[]")
    out = run("tune", "import", str(bundle))
    assert out.returncode == 2 and '"format"' in out.stderr


def stored(database, device, key, bucket):
    return json.loads(next((database / "v1" / "tune" / device).glob(f"{key}.r{bucket}.json"))
                      .read_text())


def test_pin_choose_and_unpin_from_python(database):
    report = json.loads(kiln.report("json", device=H100, op="rms_norm", cache_dir=str(database)))
    result = report["devices"][0]["results"][0]
    assert result["pinned"] is False
    chosen = result["heuristic"]
    out = kiln.tune_pin(device=H100, problem=RMS_NORM_KEY, bucket=result["bucket_rows"],
                        config=chosen, cache_dir=str(database))
    assert len(out["changed"]) == 1 and out["unchanged"] == []
    document = stored(database, H100, RMS_NORM_KEY, result["bucket_rows"])
    assert document["pinned"] is True
    assert "pinned by hand" in document["reason"]
    again = json.loads(kiln.report("json", device=H100, op="rms_norm", cache_dir=str(database)))
    assert again["devices"][0]["results"][0]["winner"] == chosen
    assert again["devices"][0]["results"][0]["pinned"] is True
    assert "(pinned)" in kiln.report("md", device=H100, op="rms_norm", cache_dir=str(database))

    out = kiln.tune_unpin(op="rms_norm", cache_dir=str(database))
    assert len(out["changed"]) == 1 and len(out["unchanged"]) >= 1
    assert "pinned" not in stored(database, H100, RMS_NORM_KEY, result["bucket_rows"])

    with pytest.raises(RuntimeError, match="no tuning result"):
        kiln.tune_pin(device="A100", cache_dir=str(database))
    with pytest.raises(RuntimeError, match="results match"):
        kiln.tune_pin(op="rms_norm", config=chosen, cache_dir=str(database))


def test_cli_pin_and_import_keep_pinned(database, tmp_path):
    cli = kiln_cli()

    def run(*args):
        env = dict(os.environ, KILN_CACHE_DIR=str(database))
        return subprocess.run([cli, *args], env=env, capture_output=True, text=True, timeout=120)

    out = run("tune", "pin", "--op", "swiglu")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("pinned ") >= 1 and SWIGLU_KEY in out.stdout
    bundle, other = tmp_path / "b.json", tmp_path / "other"
    assert run("tune", "export", str(bundle)).returncode == 0
    # Imported with --pin into an empty cache: every result arrives pinned.
    out = run("tune", "--cache-dir", str(other), "import", "--pin", str(bundle))
    assert out.returncode == 0, out.stderr
    docs = [json.loads(p.read_text()) for p in other.rglob("*.json")]
    assert docs and all(d.get("pinned") is True for d in docs if d.get("source") != "prewarm")
    # Imported into the source cache, whose swiglu results are pinned: those are kept.
    out = run("tune", "import", str(bundle))
    assert out.returncode == 0, out.stderr
    assert "kept" in out.stdout and "pinned" in out.stdout
    out = run("tune", "unpin", "--op", "swiglu", "--bucket", "1024")
    assert out.returncode == 0, out.stderr
    assert "unpinned" in out.stdout
    bad = run("tune", "pin", "--op", "rmsnorm")
    assert bad.returncode != 0 and "--op" in bad.stderr


RECORDED_TUNES = (Path(__file__).resolve().parents[1] / "cpp" / "tuner" / "data"
                  / "norm_full_tunes_h200.json")


def recorded_full_tune(key, bucket):
    """One of the recorded H200 full tunes (tests/cpp/tuner/data) timed on its bucket's rows, as
    the runtime stores it."""
    fixture = json.loads(RECORDED_TUNES.read_text())
    for tune in fixture["tunes"]:
        problem = tune["problem"]
        name = (f"{problem['op']}.{problem['dtype']}.h{problem['hidden']}.f{problem['flags']}"
                f".a{problem['align']}")
        if name == key and tune["bucket_rows"] == bucket and tune["rows"] == bucket:
            trials = [trial(dict(config(*row[:3]), extra=row[3] if len(row) > 3 else {}), "ok",
                            us, 0.1, 0.0) for row, us in tune["trials"]]
            best = min(trials, key=lambda t: t["median_us"])["config"]
            doc = document(problem, bucket, "NVIDIA H200", H200, None, trials, best, best, 1.0)
            doc["device"].update(fixture["device"], fingerprint=H200)
            return doc
    raise KeyError(key)


@pytest.mark.skipif(kiln_cli() is None,
                    reason="no kiln command of this build (set KILN_CLI or put it on PATH)")
def test_cli_tune_replay(database):
    cli = kiln_cli()

    def run(*args):
        return subprocess.run([cli, "tune", "--cache-dir", str(database), "replay", *args],
                              capture_output=True, text=True, timeout=120)

    # The hand-written tunes record a handful of configs, none the fast search asks for
    # first: it has no time for its choice, and says so.
    out = run()
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1].startswith("0 full tunes replayed")
    assert sum(line.startswith("skipped ") and "which the recording holds no time for" in line
               for line in out.stdout.splitlines()) == 3
    assert any(line.startswith("skipped prewarm-sm_90/") for line in out.stdout.splitlines())

    # Two recorded H200 full tunes: every config the search asks for has a time.
    falcon, small = "rms_norm.bf16.h4544.f1.a16", "rms_norm.bf16.h1536.f1.a16"
    falcon_tune = recorded_full_tune(falcon, 32768)
    falcon_best_us = min(t["median_us"] for t in falcon_tune["trials"])
    write(database, H200, falcon, 32768, falcon_tune)
    write(database, H200, small, 4096, recorded_full_tune(small, 4096))
    out = run("--device", "H200")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-2].startswith("2 full tunes replayed: the fast search's choice costs")
    # What tuning off would serve, beside it.
    assert lines[-1].startswith("the heuristic (what tuning off, a strict miss and a capture "
                                "run) costs")
    replayed = {line.split()[0]: line for line in lines if line.startswith("rms_norm.")}
    assert set(replayed) == {falcon, small}
    # The fast search finds rms_norm 32768x4544's best (it was 9% off before its new start).
    assert ("fast v16.t128.c128.reread=1" in replayed[falcon]
            and "best v16.t128.c128.reread=1" in replayed[falcon]
            and f"{falcon_best_us:.2f} us" in replayed[falcon] and "1.000x" in replayed[falcon]
            and "(19 measured)" in replayed[falcon])
    assert "unknown" not in replayed[falcon]
    assert "heuristic v16.t128.c128.reread=1 " in replayed[falcon]  # rms_norm's row re-read
    fast_cost = re.search(r" ([0-9.]+)x  \(19 measured\)", replayed[small])
    heuristic_cost = re.search(r" heuristic \S+ ([0-9.]+)x$", replayed[small])
    assert 1.0 < float(fast_cost.group(1)) <= 1.061
    assert float(heuristic_cost.group(1)) >= 1.0

    only = run("--op", "rms_norm", "--device", "H200")
    assert only.returncode == 0, only.stderr
    assert only.stdout.splitlines()[-2].startswith("2 full tunes replayed")
    assert run("--op", "layer_norm").returncode == 1  # nothing to replay
    bad = run("--op", "rmsnorm")
    assert bad.returncode == 2 and "expected a known op name" in bad.stderr
