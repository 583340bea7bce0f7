"""Loads a bench/ script as a module, for tests of what it computes without a GPU. bench/ goes
on sys.path because the scripts import their neighbours (common.py)."""

import importlib.util
import os
import sys

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "bench"))


def load_bench(name):
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
