"""A small block mixing nn.Linear with kiln's norm, AdaLN, RoPE and SwiGLU ops, for the
torch.compile and CUDA graph tests. Batch size is the only varying dimension."""

import torch

import kiln

HIDDEN, HEADS, INTER, SEQ = 64, 4, 96, 6
HEAD_DIM = HIDDEN // HEADS


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(HIDDEN))
        self.ada = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.qk = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.gate_up = torch.nn.Linear(HIDDEN, 2 * INTER)
        self.down = torch.nn.Linear(INTER, HIDDEN)

    def forward(self, x, cond, cos, sin):
        h = kiln.rms_norm(x, self.norm_weight)
        scale, shift = self.ada(cond).unsqueeze(1).chunk(2, dim=-1)
        h = kiln.adaln(h, scale, shift)
        q, k = self.qk(h).unflatten(-1, (2, HEADS, HEAD_DIM)).unbind(2)
        q, k = kiln.rope(q, k, cos, sin, layout="bshd")
        mixed = h + (q * k).flatten(2)
        return x + self.down(kiln.swiglu(self.gate_up(mixed)))


def rope_tables(device, dtype=torch.float32):
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    angles = torch.arange(SEQ, dtype=torch.float64)[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def inputs(batch, device, seed=0):
    gen = torch.Generator().manual_seed(seed + batch)
    x = torch.randn(batch, SEQ, HIDDEN, generator=gen).to(device)
    cond = torch.randn(batch, HIDDEN, generator=gen).to(device)
    return x, cond


def model(device):
    torch.manual_seed(0)
    return Block().to(device).eval()


def compile_capturing(module, dynamic=False):
    """``torch.compile(module, fullgraph=True)`` with a backend that keeps every FX graph
    Dynamo hands it (and runs it as traced), so a test can see which ops the compiled
    module calls; returns (compiled module, list the graphs land in). Resets Dynamo first."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(module, backend=backend, fullgraph=True, dynamic=dynamic), graphs


def calls_of(graphs, op):
    """The nodes of ``graphs`` that call ``op``."""
    return [n for gm in graphs for n in gm.graph.nodes if n.target is op]


def patched_and_compiled(module, run):
    """``run(module)`` unpatched, then ``kiln.patch(module)`` and ``run`` of the patched module
    compiled with its graphs captured (compile_capturing; Dynamo reset after): returns
    (expected, actual, graphs)."""
    expected = run(module)
    kiln.patch(module)
    compiled, graphs = compile_capturing(module)
    actual = run(compiled)
    torch._dynamo.reset()
    return expected, actual, graphs


def logits_of(ids):
    """A ``run`` for patched_and_compiled: a causal LM's logits for ``ids``, without grad."""
    def run(model):
        with torch.no_grad():
            return model(ids).logits
    return run
