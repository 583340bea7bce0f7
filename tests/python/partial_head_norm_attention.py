"""Qwen3-Next's attention prologue for kiln.patch's tests: q and its output gate from one
projection, each head of q and k RMS-normalised, then the first rotary_dim columns rotated by
transformers' Qwen3-Next apply_rotary_pos_emb, which takes a table narrower than the head (its
partial_rotary_factor). A module of its own, so that the forward's global apply_rotary_pos_emb
is that function, as in transformers' file."""

import torch
from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb

from test_patch_head_norm_cpu import HEAD_DIM, HEADS, _Attention


class PartialAttention(_Attention):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(32, 2 * HEADS * HEAD_DIM, bias=False)  # [q, gate] per head

    def forward(self, x, cos, sin):
        input_shape = x.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        # q is the first half of each head's pair: a strided view, as the model chunks it.
        query_states, gate = torch.chunk(self.q_proj(x).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1)
        query_states = self.q_norm(query_states.view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states
