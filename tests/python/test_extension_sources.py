"""The op extension's C++ (jit/, cache/, tuner/, templates/, bindings/torch/) formats and reads
without iostreams. A build may link part of libstdc++ into the extension (the H200 build
machine's compiler did: the module defined 697 symbols of libstdc++'s stream and locale
classes) beside the libstdc++ the process already loaded. On that machine an ostringstream
formatting an integer (the tuner's message for a candidate's wrong result) crashed the
process, most likely on a facet looked up in a locale made by the other copy."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("jit", "cache", "tuner", "templates", "bindings/torch")
STREAMS = re.compile(r"#include\s*<(sstream|fstream|iostream|istream|ostream|iomanip)>"
                     r"|std::(i|o)?(string|f)?stream\b|std::(cout|cerr|clog)\b")


def test_no_iostreams_in_the_extension():
    sources = [p for folder in FOLDERS for p in (ROOT / folder).rglob("*")
               if p.suffix in (".cpp", ".h", ".hpp")]
    assert len(sources) > 50, f"expected kiln's sources under {FOLDERS}, found {len(sources)}"
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in sources
             for m in STREAMS.finditer(p.read_text())]
    assert not found, found
