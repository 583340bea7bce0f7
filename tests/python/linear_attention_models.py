"""Tiny Qwen3-Next and Qwen3.5 text models (a linear-attention layer, then a full-attention one)
for the tests of kiln.patch on them, skipped where transformers lacks the model; and the check
that a patched model gives the unpatched model's logits."""

import importlib

import pytest
import torch

PREFIX = {"qwen3_next": "Qwen3Next", "qwen3_5": "Qwen3_5"}


def transformers_modules(name):
    """(modeling module, config class name) of `name`, or a skip."""
    try:
        modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        configuration = importlib.import_module(f"transformers.models.{name}.configuration_{name}")
    except ImportError:
        pytest.skip(f"transformers has no {name}")
    prefix = PREFIX[name]
    text = f"{prefix}TextConfig"
    return modeling, configuration, text if hasattr(configuration, text) else f"{prefix}Config"


def tiny_config(name, hidden=64, head_dim=16, vocab_size=100, layers=("linear_attention", "full_attention"),
                **extra):
    _, configuration, config_class = transformers_modules(name)
    config = getattr(configuration, config_class)(
        hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
        num_hidden_layers=len(layers), intermediate_size=hidden, vocab_size=vocab_size, layer_types=list(layers),
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim, **extra)
    config._attn_implementation = "eager"
    return config


def randomise_gated_norms(model):
    """Gated norms start at weight 1, where an ignored weight would go unnoticed."""
    for module in model.modules():
        if type(module).__name__.endswith("RMSNormGated"):
            with torch.no_grad():
                module.weight.normal_(1.0, 0.3)


def tiny_model(name, **config):
    modeling, _, _ = transformers_modules(name)
    torch.manual_seed(0)
    model = getattr(modeling, f"{PREFIX[name]}ForCausalLM")(tiny_config(name, **config)).eval()
    randomise_gated_norms(model)
    return model


def assert_patched_logits_match(model, ids, gated_norms, rtol=1e-5):
    """kiln.patch replaces `gated_norms` gated norms of `model`, whose logits on `ids` stay
    those of the unpatched model (within rtol of their largest)."""
    import kiln

    with torch.no_grad():
        expected = model(ids).logits
        report = kiln.patch(model)
        actual = model(ids).logits
    assert [r.op for r in report.replaced].count("rms_norm_gated") == gated_norms
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * expected.abs().max().item())
