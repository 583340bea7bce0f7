"""Helpers for the cache tests: run kiln in a fresh Python process with its own settings."""

import json
import os
import subprocess
import sys
import textwrap


def run_kiln(code, cache_dir, extra_env=None, preexec_fn=None, timeout=300):
    """Runs `code` (which may print one JSON line last) in a new interpreter with
    KILN_CACHE_DIR=cache_dir; returns (returncode, parsed last line or None, stderr)."""
    env = dict(os.environ)
    env["KILN_CACHE_DIR"] = str(cache_dir)
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, preexec_fn=preexec_fn, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines and lines[-1].startswith(("{", "[")) else None
    return proc.returncode, result, proc.stderr


def entry_files(cache_dir):
    """Every binary entry file of a cache (by name)."""
    return sorted(p for p in (cache_dir / "v1" / "bin").rglob("*.bin"))
