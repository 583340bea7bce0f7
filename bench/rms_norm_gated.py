"""The gated RMSNorm that closes the linear attention of Qwen3-Next and Qwen3.5 (and, with a
sigmoid gate, of Kimi Linear), and Mamba-2's (the gate before the norm: Bamba-9B's and Granite
4.0-H's 8192 channels, one group): kiln.rms_norm_gated beside the model's own module
(transformers' Qwen3NextRMSNormGated, KimiLinearRMSNormGated, MambaRMSNormGated, or a
restatement where the import fails) and torch.compile of it, bf16, with a copy of the same bytes
in the same rounds. The linear attention's rows are value heads: Qwen3-Next-80B's 32 heads of 128
for each token, x and the gate z each [tokens * 32, 128], as the attention reshapes them. Bytes:
x and z read once, the output written once, the weight once. The 1- and 128-token cases are
also timed back to back on the host, as a model without CUDA graphs calls them.

Usage: python bench/rms_norm_gated.py [--out DIR] [--quick] [--tag TAG]
Writes DIR/rms_norm_gated-<date>-<device>.json and .md; prints the table last."""

import argparse
import inspect
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

BF16 = torch.bfloat16
HEADS, HEAD_DIM = 32, 128
TOKENS = (1, 128, 4096, 16384)
MAMBA_CHANNELS = 8192  # Bamba-9B, Granite 4.0-H: hidden 4096, expand 2, one group


def gated_norm_module(activation, hidden=HEAD_DIM):
    """The model's module (transformers' class, its weight randomised), and where it came from.
    activation "mamba": Mamba-2's, silu of the gate before the norm."""
    try:
        if activation == "silu":
            from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated as cls
        elif activation == "sigmoid":
            from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearRMSNormGated as cls
        else:
            from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated as cls
        grouped = "group_size" in inspect.signature(cls.__init__).parameters
        module = cls(hidden, group_size=hidden, eps=1e-6) if grouped else cls(hidden, eps=1e-6)
        source = "transformers"
    except ImportError:
        module, source = Restated(hidden, activation), "restated"
    with torch.no_grad():
        module.weight.copy_(1 + 0.2 * torch.randn(hidden))
    return module.to("cuda", BF16), source


class Restated(torch.nn.Module):
    """Qwen3NextRMSNormGated.forward (silu), KimiLinearRMSNormGated.forward (sigmoid) and
    MambaRMSNormGated.forward (mamba) over one group, restated."""

    def __init__(self, hidden, activation):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon, self.activation = 1e-6, activation

    def forward(self, hidden_states, gate):
        dtype = hidden_states.dtype
        h = hidden_states.float()
        if self.activation == "mamba":
            h = h * torch.nn.functional.silu(gate.float())
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * h.to(dtype)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        if self.activation == "silu":
            h = self.weight * h.to(dtype)
            return (h * torch.nn.functional.silu(gate.float())).to(dtype)
        h = self.weight.float() * h
        return (h * torch.sigmoid(gate.float())).to(dtype)


def rel_err(actual, expected):
    a, e = actual.double(), expected.double()
    return ((a - e).abs() / e.abs().clamp_min(1.0)).max().item()


def cases(quick):
    import kiln

    shapes = [(t, "silu") for t in TOKENS] + [(4096, "sigmoid"), (1, "mamba"), (4096, "mamba")]
    if quick:
        shapes = [(1, "silu"), (4096, "silu"), (4096, "mamba")]
    for tokens, activation in shapes:
        mamba = activation == "mamba"
        width = MAMBA_CHANNELS if mamba else HEAD_DIM
        module, source = gated_norm_module(activation, width)
        rows = tokens if mamba else tokens * HEADS
        x = torch.randn(rows, width, device="cuda", dtype=BF16)
        z = torch.randn(rows, width, device="cuda", dtype=BF16)
        compiled = torch.compile(module.forward, dynamic=False)
        model = {"silu": "Qwen3-Next", "sigmoid": "Kimi Linear (sigmoid)", "mamba": "Mamba-2 (gate first)"}[activation]

        def fused(x=x, z=z, w=module.weight, activation=activation):
            if activation == "mamba":
                return kiln.rms_norm_gated(x, z, w, 1e-6, "silu", norm_before_gate=False)
            return kiln.rms_norm_gated(x, z, w, 1e-6, activation)

        yield {
            "name": f"{model} {tokens} tokens: [{rows}, {width}]",
            "bytes": 3 * x.numel() * 2 + width * 2,
            "launch_bound": tokens <= 128,
            "kiln": fused,
            "peers": {f"eager ({source})": lambda m=module, x=x, z=z: m(x, z),
                      "compiled": lambda c=compiled, x=x, z=z: c(x, z)},
            "check": lambda fused=fused, m=module, x=x, z=z: rel_err(fused(), m(x, z)),
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="a subset of the shapes")
    parser.add_argument("--tag", default="", help="appended to the file names")
    args = parser.parse_args()
    common.eager_compiled_bench("rms_norm_gated", "Gated RMSNorm (linear attention's value heads)", cases(args.quick),
                                args.out, args.tag, check="rel_err_vs_module", check_title="rel err vs module")


if __name__ == "__main__":
    main()
