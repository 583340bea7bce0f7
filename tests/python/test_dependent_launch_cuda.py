"""Programmatic dependent launch on a GPU (KILN_PDL): kiln's kernels launched so that their
CTAs may run before the kernel ahead of them has finished give the same bits as plain
launches, in eager chains and replayed from CUDA graphs, including in-place ops that
overwrite what the kernel ahead reads. Each run uses inputs the run before did not, so a
kernel that read before its producer finished would see another run's values."""

import pytest
import torch

import kiln

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

ROWS, WIDTH = 2688, 2048


def supports_pdl():
    info = kiln.device_info(0)
    return info["compute_capability"][0] >= 9 and info["driver_version"] >= 12030


def inputs(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return scale * torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    angles = rand(1, ROWS // 2, 64).float()
    return {
        "x": rand(ROWS, WIDTH), "r": rand(ROWS, WIDTH), "w": 1 + rand(WIDTH, scale=0.1),
        "b": rand(WIDTH, scale=0.1), "scale": rand(2, 1, WIDTH, scale=0.1),
        "shift": rand(2, 1, WIDTH, scale=0.1), "gate": rand(2, 1, WIDTH, scale=0.5),
        "q": rand(1, 16, ROWS // 2, 128), "k": rand(1, 4, ROWS // 2, 128),
        "cos": torch.cat([angles.cos()] * 2, -1), "sin": torch.cat([angles.sin()] * 2, -1),
    }


def chain(t, repeats=3):
    """Every op family, each reading what the one before wrote; in-place ops overwrite what
    the kernel before them read."""
    h, r, q, k = t["x"], t["r"], t["q"], t["k"]
    for _ in range(repeats):
        h = kiln.rms_norm(h, t["w"])
        h, r = kiln.fused_add_rms_norm(h, r, t["w"])
        kiln.fused_add_rms_norm_(h, r, t["w"])
        n = kiln.layer_norm(h, t["w"], t["b"]).view(2, -1, WIDTH)
        a = kiln.adaln(n, t["scale"], t["shift"])
        g = kiln.gated_residual(a, n, t["gate"])
        kiln.gated_residual_(g, a, t["gate"])
        h = kiln.swiglu(kiln.gelu(g), g).view(ROWS, WIDTH)
        q, k = kiln.rope(q, k, t["cos"], t["sin"])
        kiln.rope_(q, k, t["cos"], t["sin"])
    return h, r, q, k


def run_chain(pdl, seed):
    kiln.configure(pdl=pdl)
    with torch.no_grad():
        out = chain(inputs(seed))
    torch.cuda.synchronize()
    return [o.clone() for o in out]


def assert_same_bits(actual, expected):
    for a, e in zip(actual, expected):
        assert torch.isfinite(e.float()).all()
        assert torch.equal(a, e), (a.float() - e.float()).abs().max().item()


def test_kernels_launch_programmatically_only_where_asked_and_supported():
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    for pdl in ("on", "off"):
        kiln.configure(pdl=pdl)
        assert kiln.settings()["pdl"] == pdl
        kiln.rms_norm(x, w)
        (kernel,) = [k for k in kiln._C.loaded_kernels() if k["op"] == "rms_norm"]
        assert kernel["programmatic"] == (pdl == "on" and supports_pdl())


def test_eager_chain_same_bits_programmatic_and_plain():
    for seed in (1, 2, 3):
        # The programmatic run first: what its tensors' memory held came from the last seed.
        programmatic = run_chain("on", seed)
        plain = run_chain("off", seed)
        assert_same_bits(programmatic, plain)


def test_graph_replays_same_bits_programmatic_and_plain():
    expected = {seed: run_chain("off", seed) for seed in (11, 12, 13)}
    kiln.configure(pdl="on")
    static = inputs(10)
    with torch.no_grad():
        chain(static)  # load the kernels outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = chain(static)
    assert all(k["programmatic"] == supports_pdl() for k in kiln._C.loaded_kernels())
    for seed, plain in expected.items():
        for name, value in inputs(seed).items():
            static[name].copy_(value)
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bits(outs, plain)
