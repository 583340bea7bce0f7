"""Chains of kiln's memory-bound ops replayed from a CUDA graph, as a decode step or a DiT
block replays them, to show what programmatic dependent launch saves (KILN_PDL, on by
default on sm_90: each kiln kernel's CTAs are placed while the kernel ahead of it drains).

Each chain is a "layer" of four ops repeated --layers times in one graph, the matmuls left
out, so the ops follow one another as they do between a model's GEMMs:
- llm (Llama-3-8B widths, R tokens): fused_add_rms_norm [R, 4096] -> rope (q [1, 32, R, 128],
  k [1, 8, R, 128], transformers' table) -> packed swiglu [R, 2 x 14336] -> fused_add_rms_norm.
- dit (LTX-Video widths, one sample of R tokens): adaln [1, R, 2048] (per-sample scale and
  shift) -> gelu (tanh) -> gated_residual (per-sample gate) -> layer_norm without affine.
Contenders, each its own graph of the same chain: kiln with programmatic launches ("kiln"),
kiln with plain launches ("kiln, plain launch", KILN_PDL=off), torch.compile of each op's
eager formula on its own ("compiled ops", the per-op peer of the kernel tables),
torch.compile of the whole chain ("compiled chain": with no matmul between them Inductor
fuses neighbouring ops into fewer kernels, which a model's GEMMs would keep apart), both also
with Inductor's own programmatic launches ("(PDL)", TORCHINDUCTOR_ENABLE_PDL=1, off by
default in torch), and the eager formulas. The graphs are replayed in interleaved rounds, timed as the kernel tables
time one call (bench_side_by_side: the L2 flushed before each replay); per-op times are a
replay's time over the ops in it. kiln's two graphs must give bit-identical outputs.

Usage: python bench/op_chains.py [--rows 1,128,2688] [--layers 8] [--chains llm,dit]
       [--out DIR] [--tag T] [--quick]
Writes DIR/op-chains-<date>-<device>[-T].json and .md; prints the table last."""

import argparse
import functools
import os
import sys

import torch
import torch._inductor.config  # noqa: F401 (Inductor's PDL switch)
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from norms import EPS, diffusers_rms_norm, llama_rms_norm  # noqa: E402
from rope import hf_apply, llama_table  # noqa: E402

BF16 = torch.bfloat16
ROWS = [1, 128, 2688]
CHAINS = ["llm", "dit"]
OPS_PER_LAYER = 4


def llm_chain(rows, layers, kiln):
    """(kiln step, per-op eager functions, step taking those). Every op reads what an op of
    this or the layer before wrote, or a buffer of its own layer (what the layer's GEMM would
    have written), and every output is returned, so no compiler can drop or merge a layer."""
    gen = torch.Generator(device="cuda").manual_seed(rows)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=BF16, generator=gen)

    x, res = rand(rows, 4096), rand(rows, 4096)
    w1, w2 = 1 + 0.1 * rand(4096), 1 + 0.1 * rand(4096)
    q0, k0 = rand(1, 32, rows, 128), rand(1, 8, rows, 128)
    gate_ups = [rand(rows, 2 * 14336) for _ in range(layers)]
    downs = [rand(rows, 4096) for _ in range(layers)]
    cos, sin = llama_table(1, rows, 128)
    apply_rotary, _ = hf_apply()

    def add_norm(a, r, w):
        s = a + r
        return llama_rms_norm(s, w), s

    def swiglu(t):
        g, u = t.chunk(2, dim=-1)
        return F.silu(g) * u

    def kiln_step():
        h, r, q, k, acts = x, res, q0, k0, []
        for layer in range(layers):
            h, r = kiln.fused_add_rms_norm(h, r, w1, EPS)
            q, k = kiln.rope(q, k, cos, sin)
            acts.append(kiln.swiglu(gate_ups[layer]))
            h, r = kiln.fused_add_rms_norm(downs[layer], r, w2, EPS)
        return (h, r, q, k, *acts)

    def ops_step(fns):
        h, r, q, k, acts = x, res, q0, k0, []
        for layer in range(layers):
            h, r = fns["add_norm"](h, r, w1)
            q, k = fns["rope"](q, k, cos, sin)
            acts.append(fns["swiglu"](gate_ups[layer]))
            h, r = fns["add_norm"](downs[layer], r, w2)
        return (h, r, q, k, *acts)

    return kiln_step, {"add_norm": add_norm, "rope": apply_rotary, "swiglu": swiglu}, ops_step


def dit_chain(rows, layers, kiln):
    gen = torch.Generator(device="cuda").manual_seed(rows + 1)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=BF16, generator=gen)

    h0 = rand(1, rows, 2048)
    scale, shift, gate = 0.1 * rand(1, 1, 2048), 0.1 * rand(1, 1, 2048), 0.1 * rand(1, 1, 2048)

    def adaln(t, sc, sh):
        return diffusers_rms_norm(t) * (1 + sc) + sh

    def gelu(t):
        return F.gelu(t, approximate="tanh")

    def gated_residual(t, y, g):
        return t + y * g

    def layer_norm(t):
        return F.layer_norm(t, (t.shape[-1],), None, None, EPS)

    def kiln_step():
        h = h0
        for _ in range(layers):
            n = kiln.adaln(h, scale, shift, None, EPS, "rms")
            y = kiln.gelu(n)
            h = kiln.gated_residual(h, y, gate)
            h = kiln.layer_norm(h, None, None, EPS)
        return h

    def ops_step(fns):
        h = h0
        for _ in range(layers):
            n = fns["adaln"](h, scale, shift)
            y = fns["gelu"](n)
            h = fns["gated_residual"](h, y, gate)
            h = fns["layer_norm"](h)
        return h

    return kiln_step, {"adaln": adaln, "gelu": gelu, "gated_residual": gated_residual,
                       "layer_norm": layer_norm}, ops_step


MAKERS = {"llm": llm_chain, "dit": dit_chain}


def outputs_of(out):
    return out if isinstance(out, tuple) else (out,)


def max_rel_err(actual, expected):
    """The largest of common.relative_errors' max_rel over a chain's outputs."""
    return max(common.relative_errors(a, e)["max_rel"]
               for a, e in zip(outputs_of(actual), outputs_of(expected)))


def run_chain(chain, rows, layers, kiln):
    kiln_step, eager_fns, ops_step = MAKERS[chain](rows, layers, kiln)
    graphs, outs, programmatic = {}, {}, {}
    for name, pdl in (("kiln", "on"), ("kiln, plain launch", "off")):
        kiln.configure(pdl=pdl)  # forgets the loaded kernels: the next calls load them again
        graphs[name], outs[name] = common.capture_graph(kiln_step, kiln)
        # How the graph's kernels were launched: programmatically only with pdl on, on sm_90.
        programmatic[name] = sorted({k["programmatic"] for k in kiln._C.loaded_kernels()})
    kiln.configure(pdl="on")
    # torch.compile with and without Inductor's own programmatic launches (off by default,
    # TORCHINDUCTOR_ENABLE_PDL=1). Dynamo is reset between the two so that neither reuses the
    # other's code; a captured graph no longer needs it.
    for suffix, inductor_pdl in (("", False), (" (PDL)", True)):
        torch._dynamo.reset()
        with torch._inductor.config.patch({"triton.enable_pdl": inductor_pdl}):
            compiled_fns = {name: torch.compile(fn, dynamic=False) for name, fn in eager_fns.items()}
            name = "compiled ops" + suffix
            graphs[name], outs[name] = common.capture_graph(lambda: ops_step(compiled_fns))
            whole = torch.compile(functools.partial(ops_step, eager_fns), dynamic=False)
            name = "compiled chain" + suffix
            graphs[name], outs[name] = common.capture_graph(whole)
    graphs["eager"], outs["eager"] = common.capture_graph(lambda: ops_step(eager_fns))
    for graph in graphs.values():
        graph.replay()
    torch.cuda.synchronize()
    identical = all(torch.equal(a, b) for a, b in zip(outputs_of(outs["kiln"]), outputs_of(outs["kiln, plain launch"])))
    if not identical:
        raise AssertionError(f"{chain} x {rows}: kiln's programmatic and plain graphs disagree")
    err = max_rel_err(outs["kiln"], outs["eager"])
    ms = common.bench_side_by_side({name: graph.replay for name, graph in graphs.items()}, rep=60)
    ops = OPS_PER_LAYER * layers
    return {"chain": chain, "rows": rows, "layers": layers, "ops": ops,
            "us_per_op": {name: t * 1e3 / ops for name, t in ms.items()},
            "replay_us": {name: t * 1e3 for name, t in ms.items()},
            "kiln_vs_eager_max_rel_err": err, "programmatic_equals_plain": identical,
            "kiln_launched_programmatically": programmatic}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--chains", default=",".join(CHAINS))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--quick", action="store_true", help="rows 1 and 2688, 4 layers")
    args = parser.parse_args()
    rows_list = [1, 2688] if args.quick else [int(r) for r in args.rows.split(",")]
    layers = 4 if args.quick else args.layers
    kiln = common.fresh_kiln()
    env = common.environment()
    env["kiln_settings"] = kiln.settings()
    results = []
    for chain in args.chains.split(","):
        for rows in rows_list:
            result = run_chain(chain, rows, layers, kiln)
            results.append(result)
            us = result["us_per_op"]
            print(f"{chain} x {rows}: " + ", ".join(f"{k} {v:.2f}" for k, v in us.items()) + " us/op", flush=True)

    name = f"op-chains-{common.stamp(env)}" + (f"-{args.tag}" if args.tag else "")
    common.write_json(os.path.join(args.out, name + ".json"), {"environment": env, "results": results})
    lines = [f"# Op chains from CUDA graphs, {env['device']} ({env['sm']}), {env['date']}", "",
             f"torch {env['versions']['torch']}, driver {env['driver']}. {env['timing']}; a replay's time "
             f"over the {OPS_PER_LAYER * layers} ops in it.", "",
             "| chain | rows | kiln us/op | kiln, plain launch | compiled ops | compiled ops (PDL) | "
             "compiled chain | compiled chain (PDL) | eager | plain / kiln | compiled ops (PDL) / kiln | "
             "compiled chain (PDL) / kiln | max rel err vs eager |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        us = r["us_per_op"]
        lines.append(f"| {r['chain']} | {r['rows']} | {us['kiln']:.2f} | {us['kiln, plain launch']:.2f} | "
                     f"{us['compiled ops']:.2f} | {us['compiled ops (PDL)']:.2f} | {us['compiled chain']:.2f} | "
                     f"{us['compiled chain (PDL)']:.2f} | {us['eager']:.2f} | "
                     f"{us['kiln, plain launch'] / us['kiln']:.3f}x | {us['compiled ops (PDL)'] / us['kiln']:.3f}x | "
                     f"{us['compiled chain (PDL)'] / us['kiln']:.3f}x | {r['kiln_vs_eager_max_rel_err']:.1e} |")
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
