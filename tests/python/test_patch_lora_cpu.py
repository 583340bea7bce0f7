"""kiln.patch with LoRA adapters (peft, through diffusers' adapter API), added before or after the
patch: the adapted projections are the modules kiln's forwards call, so each adapter's delta,
its weight, disabling it and fusing it into the base weights reach the output as in diffusers'
model, and the patch takes the same modules as without adapters."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("peft", reason="peft is not installed")
from peft import LoraConfig  # noqa: E402

from test_patch_dit_cpu import _agree, _flux, _flux_inputs  # noqa: E402
from test_patch_diffusers_hooks_cpu import replaced, run  # noqa: E402
from test_patch_wan_cpu import _wan, _wan_inputs  # noqa: E402

# Every projection of the blocks: attention, feed-forward (the GELU's own projection included),
# FLUX's single blocks' fused MLP input and output.
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
           "net.0.proj", "net.2", "proj_mlp", "proj_out"]
MODELS = {"flux": (_flux, _flux_inputs), "wan": (_wan, _wan_inputs)}


def _adapt(model, name="style", seed=0):
    """A LoRA adapter with random (not zero) up-projections, as a trained one has."""
    torch.manual_seed(seed)
    model.add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False), name)
    return model


@pytest.mark.parametrize("order", ["adapter_then_patch", "patch_then_adapter"])
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_lora_adapters_reach_the_patched_output(arch, order):
    build, inputs = MODELS[arch]
    x = inputs(torch.float32)
    unadapted = replaced(kiln.patch(build(torch.float32)))
    reference = _adapt(build(torch.float32))
    model = build(torch.float32)
    if order == "adapter_then_patch":
        report = kiln.patch(_adapt(model))
    else:
        report = kiln.patch(model)
        _adapt(model)
    assert replaced(report) == unadapted and report.left == []
    plain = run(build(torch.float32), x)
    expected = run(reference, x)
    assert (expected - plain).abs().max() > 0.1 * plain.abs().max()  # the adapter moves the output
    _agree(run(model, x), expected, torch.float32)
    for m in (model, reference):  # half the adapter's weight
        m.set_adapters("style", weights=0.5)
    _agree(run(model, x), run(reference, x), torch.float32)
    for m in (model, reference):
        m.disable_adapters()
    _agree(run(model, x), plain, torch.float32)
    for m in (model, reference):
        m.enable_adapters()
        m.set_adapters("style", weights=1.0)
        m.fuse_lora()  # into the base weights, in place
    _agree(run(model, x), expected, torch.float32)
    for m in (model, reference):
        m.unfuse_lora()
        m.unload_lora()
    _agree(run(model, x), plain, torch.float32)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_a_lora_state_dict_loads_into_a_patched_model(arch):
    """What a pipeline's load_lora_weights calls (the model's load_lora_adapter, from a state dict
    of a trained adapter) into the patched model and into diffusers': the same output."""
    from peft.utils import get_peft_model_state_dict

    build, inputs = MODELS[arch]
    x = inputs(torch.float32)
    trained = get_peft_model_state_dict(_adapt(build(torch.float32)), adapter_name="style")
    outputs = []
    for patched in (False, True):
        model = build(torch.float32)
        if patched:
            kiln.patch(model)
        model.load_lora_adapter({f"transformer.{k}": v for k, v in trained.items()}, adapter_name="style",
                                prefix="transformer")
        outputs.append(run(model, x))
    assert (outputs[0] - run(build(torch.float32), x)).abs().max() > 0.1 * outputs[0].abs().max()
    _agree(outputs[1], outputs[0], torch.float32)
