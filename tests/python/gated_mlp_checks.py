"""Checks shared by the tests of diffusers transformers whose gated feed-forwards kiln.patch takes
(a kiln.swiglu between the projections) while their blocks stay diffusers'."""

import torch

import kiln
from test_patch_dit_cpu import Counter, _agree


def assert_feed_forwards_gate_once(model, inputs, paths, kind, dtype, monkeypatch):
    """kiln.patch replaces each feed-forward at ``paths`` with ``kind``, a forward calls kiln.swiglu
    once each and agrees with diffusers' (in ``dtype``), and unpatch restores diffusers' bits."""
    with torch.no_grad():
        expected = model(**inputs)[0]
    report = kiln.patch(model)
    kinds = {r.path: r.kind for r in report.replaced}
    assert paths and all(kinds[p] == kind for p in paths)
    counter = Counter(monkeypatch, more=[(kiln.activation_ops, "swiglu")])
    with torch.no_grad():
        actual = model(**inputs)[0]
    assert counter.calls["swiglu"] == len(paths)
    _agree(actual, expected, dtype)
    assert kiln.unpatch(model) == len(report.replaced)
    with torch.no_grad():
        assert torch.equal(model(**inputs)[0], expected)


def assert_trains_as_diffusers(model, inputs, weights):
    """The gradients of ``weights(model)`` (a non-empty list) after kiln.patch are diffusers'."""
    params = weights(model)
    assert params
    model(**inputs)[0].pow(2).mean().backward()
    grads = [p.grad.clone() for p in params]
    model.zero_grad()
    kiln.patch(model)
    model(**inputs)[0].pow(2).mean().backward()
    for p, grad in zip(params, grads):
        torch.testing.assert_close(p.grad, grad, rtol=1e-4, atol=1e-6)
