"""LTX-Video's cross-attention mask, prepared once per forward where diffusers' processor
prepares it in every block."""

import weakref

import torch


class PreparedMasks:
    """``attn.prepare_attention_mask`` and the [B, heads, 1 or T, S] view of it, as diffusers'
    processor makes it in every block, from the one mask the transformer made for the
    forward (a copy per head each time). The last one is kept for the next block: for the
    very same mask tensor (weakly held), both unchanged (version counters), the same module
    class, head count and lengths. Not used while compiling or while a CUDA graph captures,
    and not kept under autograd."""

    def __init__(self):
        self._entry = None

    def __call__(self, attn, mask: torch.Tensor, sequence_length: int, batch_size: int) -> torch.Tensor:
        if torch.compiler.is_compiling() or (mask.is_cuda and torch.cuda.is_current_stream_capturing()):
            # Neither kept nor taken: a graph must own what it reads, or a later call that
            # replaced the entry would free memory its replays still read.
            return _made(attn, mask, sequence_length, batch_size)
        method = getattr(attn.prepare_attention_mask, "__func__", None)
        key = (method, attn.heads, sequence_length, batch_size)
        entry = self._entry
        if entry is not None and entry[0]() is mask and entry[1] == (mask._version, entry[3]._version) \
                and entry[2] == key:
            return entry[3]
        prepared = _made(attn, mask, sequence_length, batch_size)
        if method is not None and not (torch.is_grad_enabled() and (mask.requires_grad or prepared.requires_grad)):
            self._entry = (weakref.ref(mask, self._forget), (mask._version, prepared._version), key, prepared)
        return prepared

    def _forget(self, ref) -> None:
        entry = self._entry
        if entry is not None and entry[0] is ref:
            self._entry = None


prepare = PreparedMasks()


def _made(attn, mask: torch.Tensor, sequence_length: int, batch_size: int) -> torch.Tensor:
    prepared = attn.prepare_attention_mask(mask, sequence_length, batch_size)
    return prepared.view(batch_size, attn.heads, -1, prepared.shape[-1])
