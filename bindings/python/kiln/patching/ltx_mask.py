"""LTX-Video's cross-attention mask, prepared once per forward where diffusers' processor
prepares it in every block."""

import weakref
from typing import NamedTuple

import torch

from .forwards import recording_a_graph


class _Kept(NamedTuple):
    mask_ref: weakref.ref
    versions: tuple  # the mask's and the prepared tensor's version counters
    key: tuple  # prepare_attention_mask's function, head count, lengths
    prepared: torch.Tensor


class PreparedMasks:
    """``attn.prepare_attention_mask`` and the [B, heads, 1 or T, S] view of it, as diffusers'
    processor makes it in every block, from the one mask the transformer made for the
    forward (a copy per head each time). The last one is kept for the next block: for the
    very same mask tensor (weakly held), both unchanged, the same module class, head count
    and lengths. Neither kept nor taken where a graph is recorded or for an inference tensor,
    and not kept under autograd."""

    def __init__(self):
        self._kept = None

    def __call__(self, attn, mask: torch.Tensor, sequence_length: int, batch_size: int) -> torch.Tensor:
        # Inference tensors keep no version counter to show the mask unchanged.
        if recording_a_graph(mask) or mask.is_inference():
            return _made(attn, mask, sequence_length, batch_size)
        method = getattr(attn.prepare_attention_mask, "__func__", None)
        key = (method, attn.heads, sequence_length, batch_size)
        kept = self._kept
        if kept is not None and kept.mask_ref() is mask and kept.key == key \
                and kept.versions == (mask._version, kept.prepared._version):
            return kept.prepared
        prepared = _made(attn, mask, sequence_length, batch_size)
        if method is not None and not (torch.is_grad_enabled() and (mask.requires_grad or prepared.requires_grad)):
            self._kept = _Kept(weakref.ref(mask, self._forget), (mask._version, prepared._version), key, prepared)
        return prepared

    def _forget(self, ref: weakref.ref) -> None:
        kept = self._kept
        if kept is not None and kept.mask_ref is ref:
            self._kept = None


prepare = PreparedMasks()


def _made(attn, mask: torch.Tensor, sequence_length: int, batch_size: int) -> torch.Tensor:
    prepared = attn.prepare_attention_mask(mask, sequence_length, batch_size)
    return prepared.view(batch_size, attn.heads, -1, prepared.shape[-1])
