"""The op extension's C++ (jit/, cache/, tuner/, templates/, bindings/torch/) formats and reads
without iostreams. A build may link part of libstdc++ into the extension (the H200 build
machine's compiler did: the module defined 697 of libstdc++'s symbols, the locale's among
them) beside the libstdc++ the process already loaded. A stream that formats a number then
looks a facet up in a locale made by the other copy: on that machine the tuner's message for
a candidate's wrong result crashed the process that way."""

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
