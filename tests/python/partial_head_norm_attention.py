"""Qwen3-Next's attention prologue for kiln.patch's tests: each head of q and k RMS-normalised,
then the first rotary_dim columns rotated by transformers' Qwen3-Next apply_rotary_pos_emb,
which takes a table narrower than the head (its partial_rotary_factor). A module of its own, so
that the forward's global apply_rotary_pos_emb is that function, as in transformers' file."""

import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


class PartialAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = HEAD_DIM
        self.q_proj = torch.nn.Linear(32, HEADS * HEAD_DIM, bias=False)
        self.k_proj = torch.nn.Linear(32, KV_HEADS * HEAD_DIM, bias=False)
        self.q_norm, self.k_norm = Qwen3RMSNorm(HEAD_DIM, eps=1e-6), Qwen3RMSNorm(HEAD_DIM, eps=1e-6)
        with torch.no_grad():
            self.q_norm.weight.copy_(1 + 0.3 * torch.randn(HEAD_DIM))
            self.k_norm.weight.copy_(1 + 0.3 * torch.randn(HEAD_DIM))

    def forward(self, x, cos, sin):
        hidden_shape = (*x.shape[:-1], -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states, key_states
