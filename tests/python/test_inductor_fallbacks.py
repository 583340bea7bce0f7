"""kiln's ops reach Inductor as explicit fallbacks, so Inductor never takes its implicit
fallback path, whose log message (formatted at any log level) grows exponentially with
the depth of the graph before a kiln op: a whole-model compile of a patched LTX-Video never
finished its first call. Each check runs in a fresh process, so the import order is the one
under test."""

import json
import os
import subprocess
import sys

import pytest

# Prints every kiln overload Inductor has no lowering for, after the imports in order.
MISSING = r"""
import json, sys
for name in sys.argv[1:]:
    __import__(name)
import torch
import torch._inductor.lowering as lowering
from kiln import _inductor
ops = _inductor.kiln_overloads()
hooks = [f for f in sys.meta_path if isinstance(f, _inductor._RegisterAfterImport)]
print(json.dumps({"ops": len(ops), "missing": [str(op) for op in ops if op not in lowering.lowerings],
                  "hooks_left": len(hooks)}))
"""

# Compiles a chain of kiln ops with Inductor on the CPU, with Inductor's graph logger at
# INFO, and reports the implicit-fallback messages and the result against eager.
COMPILE = r"""
import json, logging
import torch
import kiln

messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage()[:200])
graph_log = logging.getLogger("torch._inductor.graph")
graph_log.setLevel(logging.INFO)
graph_log.addHandler(Keep())

def blocks(h, w, gate):
    for _ in range(3):  # each block reads h twice: a diamond per block
        h = kiln.gated_residual(h, kiln.rms_norm(h, w, 1e-6), gate)
    return kiln.layer_norm(h, None, None, 1e-5)

torch.manual_seed(0)
h, w, gate = torch.randn(2, 4, 64), torch.randn(64), torch.randn(2, 1, 64)
expected = blocks(h, w, gate)
got = torch.compile(blocks, backend="inductor", fullgraph=True)(h, w, gate)
print(json.dumps({"implicit": [m for m in messages if "implicit fallback" in m],
                  "max_abs_diff": (got - expected).abs().max().item()}))
"""


def run(script, *args):
    # No cached graph: a cache hit would skip the lowering under test.
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                         timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", [("kiln",), ("torch._inductor.lowering", "kiln")])
def test_every_kiln_overload_has_an_inductor_lowering(order):
    result = run(MISSING, *order)
    assert result["ops"] >= 20  # rms_norm ... rope_3d, their _out and backward ops
    assert result["missing"] == []
    assert result["hooks_left"] == 0  # the import hook fired once and left


def test_inductor_compile_takes_no_implicit_fallback():
    result = run(COMPILE)
    assert result["implicit"] == []
    assert result["max_abs_diff"] < 1e-4
