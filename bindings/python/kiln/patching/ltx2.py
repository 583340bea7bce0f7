"""LTX-2's transformer (diffusers' ``LTX2VideoTransformer3DModel``: LTX-2 and LTX-2.3, video and
audio streams in one block): its attention processor and its blocks' seams.

The attention RMS-normalises q and k across all heads and rotates them by cos/sin tables:
LTX-2's checkpoints rotate each head's halves (``rope_type="split"``: tables [B, H, T, D/2], a
view of [B, T, H, D/2], each head its own angles), diffusers' default rotates adjacent pairs
across the whole row as LTX-Video does (``"interleaved"``: tables [B, T, C]). diffusers runs
each rotation as about eight kernels with fp32 temporaries; kiln rotates q and k in one
``kiln.rope`` (split: each token's heads as rows of D with a half table, which is what the
table's storage holds), or one ``kiln.rope`` each where q and k take different tables (the
audio-video cross-attentions). Interleaved self-attention with RMSNorms kiln computes and no
graph to record takes norms and rotation in one ``kiln.rms_norm_rope``, as LTX-Video does.

The block, each stream (video and audio) with its own tables:

* norm1 and ``x * (1 + scale) + shift`` -> one ``kiln.adaln`` (table rows read beside temb's
  slices, the sum never materialised);
* ``h + attn1 * gate`` then norm2 (LTX-2.3: with its text-query modulation) -> one
  ``kiln.gated_adaln``;
* ``h + attn2`` (LTX-2.3: ``* gate``) then the audio-video norm and its first modulation -> one
  ``kiln.gated_adaln``, its second modulation one ``kiln.adaln``;
* ``h + gate * a2v`` (``v2a``) then norm3 and the feed-forward's modulation -> one
  ``kiln.gated_adaln``;
* ``h + ff * gate`` -> one ``kiln.gated_residual_`` into that new h.

Gates are summed as diffusers rounds them (table + temb in the model's dtype). Each seam is
rounded once to h's dtype where diffusers rounds after each product and sum. The attentions
and feed-forwards are the block's own modules (patched where kiln.patch patched them).
Anything else (autograd, hooks on the norms, a norm kiln does not compute, shapes the seams do
not take) runs diffusers' forward, and so does torch.compile's tracing, where Inductor fuses the
seams with their neighbours itself.
"""

import sys
from typing import Callable, Optional

import torch

from .. import activation_ops, norm_ops, rope_ops
from .forwards import (SharedAttentionSettings, any_hooks, argument_binder, kiln_can_take, norm_eps,
                       records_parameters, signature_kept)
from .ltx import constant, norm_weight, table_fits

BLOCK_OPS = "adaln + gated_adaln + gated_residual"


def _flat_rotation(x: torch.Tensor, table, heads: int, interleaved: bool):
    """(x, cos, sin, head_dim) as one kiln.rope takes them for diffusers' rotation of x [B, T, C]
    by ``table``, or None."""
    if not (isinstance(table, tuple) and len(table) == 2 and x.dim() == 3):
        return None
    cos, sin = table
    if interleaved:
        if table_fits(cos, x) and table_fits(sin, x):
            return x, cos, sin, x.shape[2]
        return None
    b, t, c = x.shape
    # [B', H, T, D/2], each a view of a contiguous [B', T, H, D/2]: token t's heads are rows of
    # D columns, and row (t, h) turns by table row t * H + h.
    if not all(isinstance(f, torch.Tensor) and f.dim() == 4 and f.device == x.device
               and f.dtype in (torch.float32, x.dtype) for f in (cos, sin)) or cos.shape != sin.shape:
        return None
    tb, th, tt, half = cos.shape
    if th != heads or tt != t or 2 * half * heads != c or tb not in (1, b) \
            or not cos.transpose(1, 2).is_contiguous() or not sin.transpose(1, 2).is_contiguous():
        return None
    rows = (tb, t * heads, half)
    return x.reshape(b, t * heads, 2 * half), cos.transpose(1, 2).view(rows), sin.transpose(1, 2).view(rows), 2 * half


@signature_kept
class LTX2AttnProcessor(SharedAttentionSettings):
    """diffusers' ``LTX2AudioVideoAttnProcessor.__call__`` with its q/k rotation in kiln's launches
    (see the module's docstring); projections, norms, gates and attention are diffusers'."""

    def __init__(self, original: object, fuse_norms: bool = False):
        self.original = original
        # The module's q/k norms are RMSNorms one kiln call computes (checked when patched).
        self.fuse_norms = fuse_norms
        self._ones = {}
        module = sys.modules[type(original).__module__]
        self._interleaved = module.apply_interleaved_rotary_emb
        self._split = module.apply_split_rotary_emb
        self._dispatch = module.dispatch_attention_fn

    def _diffusers_rotation(self, attn, x, table):
        if attn.rope_type == "interleaved":
            return self._interleaved(x, table)
        return self._split(x, table)

    def _fused(self, attn, query, key, table):
        """norm_q, norm_k and the interleaved rotation by one table as one kiln.rms_norm_rope, or None."""
        if not self.fuse_norms or attn.rope_type != "interleaved" or query.shape != key.shape \
                or any_hooks(attn.norm_q) or any_hooks(attn.norm_k):
            return None
        wq, wk = norm_weight(attn.norm_q, query, self._ones), norm_weight(attn.norm_k, key, self._ones)
        eps = norm_eps(attn.norm_q, query)
        rotation = _flat_rotation(query, table, attn.heads, True)
        if rotation is None or eps != norm_eps(attn.norm_k, key) or not kiln_can_take(query, key, wq, wk) \
                or wq.shape != (query.shape[-1],) or wk.shape != (key.shape[-1],) or query.shape[-1] < 6:
            return None
        return rope_ops.rms_norm_rope(query, key, wq, wk, eps, rotation[1], rotation[2])

    def _rotated(self, attn, query, key, q_table, k_table, one_table: bool):
        """query and key (normalised) rotated as diffusers rotates them (``one_table``: both by q_table)."""
        interleaved = attn.rope_type == "interleaved"
        q_rot = _flat_rotation(query, q_table, attn.heads, interleaved)
        k_rot = _flat_rotation(key, k_table, attn.heads, interleaved)
        if attn.rope_type not in ("interleaved", "split") or q_rot is None or k_rot is None \
                or not kiln_can_take(query, key, differentiable=True):
            return self._diffusers_rotation(attn, query, q_table), self._diffusers_rotation(attn, key, k_table)
        style = dict(interleaved=interleaved, rotary_dim=q_rot[3], layout="bshd", head_dim=q_rot[3])
        if one_table and q_rot[0].shape == k_rot[0].shape:
            q, k = rope_ops.rope(q_rot[0], k_rot[0], q_rot[1], q_rot[2], **style)
            return q.view(query.shape), k.view(key.shape)
        # Tables of their own (and lengths: one stream's queries, the other's keys): one
        # rotation each, each with no second tensor (a partner of no heads).
        rotated = []
        for x, (rows, cos, sin, head_dim) in ((query, q_rot), (key, k_rot)):
            style.update(rotary_dim=head_dim, head_dim=head_dim)
            rotated.append(rope_ops.rope(rows, rows[..., :0], cos, sin, **style)[0].view(x.shape))
        return tuple(rotated)

    def _normed_rotated(self, attn, query, key, query_rotary_emb, key_rotary_emb):
        """norm_q(query), norm_k(key) and their rotation (key's by key_rotary_emb, else by query's)."""
        one_table = key_rotary_emb is None
        if query_rotary_emb is not None and one_table:
            fused = self._fused(attn, query, key, query_rotary_emb)
            if fused is not None:
                return fused
        query, key = attn.norm_q(query), attn.norm_k(key)
        if query_rotary_emb is None:
            return query, key
        k_table = query_rotary_emb if one_table else key_rotary_emb
        return self._rotated(attn, query, key, query_rotary_emb, k_table, one_table)

    @staticmethod
    def _prepared(attn, hidden_states, encoder_hidden_states, attention_mask):
        """(the mask as the attention takes it, the keys' and values' source, the gates' logits)."""
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape)
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None
        return attention_mask, encoder_hidden_states, gate_logits

    def _attention(self, attn, query, key, value, attention_mask):
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        hidden_states = self._dispatch(query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                                       backend=self._attention_backend, parallel_config=self._parallel_config)
        return hidden_states.flatten(2, 3).to(query.dtype)

    @staticmethod
    def _gated_out(attn, hidden_states, gate_logits):
        if gate_logits is not None:
            hidden_states = hidden_states.unflatten(2, (attn.heads, -1))
            gates = 2.0 * torch.sigmoid(gate_logits)
            hidden_states = (hidden_states * gates.unsqueeze(-1)).flatten(2, 3)
        hidden_states = attn.to_out[0](hidden_states)
        return attn.to_out[1](hidden_states)

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None, query_rotary_emb=None,
                 key_rotary_emb=None) -> torch.Tensor:
        attention_mask, source, gate_logits = self._prepared(attn, hidden_states, encoder_hidden_states,
                                                             attention_mask)
        query, key = self._normed_rotated(attn, attn.to_q(hidden_states), attn.to_k(source), query_rotary_emb,
                                          key_rotary_emb)
        hidden_states = self._attention(attn, query, key, attn.to_v(source), attention_mask)
        return self._gated_out(attn, hidden_states, gate_logits)


@signature_kept
class LTX2PerturbedAttnProcessor(LTX2AttnProcessor):
    """diffusers' ``LTX2PerturbedAttnProcessor.__call__`` (LTX-2.3's: spatio-temporal guidance
    replaces the attention of perturbed samples by its values) with the q/k rotation in kiln's
    launches, as :class:`LTX2AttnProcessor`."""

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None, query_rotary_emb=None, key_rotary_emb=None,
                 perturbation_mask: Optional[torch.Tensor] = None, all_perturbed=None) -> torch.Tensor:
        attention_mask, source, gate_logits = self._prepared(attn, hidden_states, encoder_hidden_states,
                                                             attention_mask)
        value = attn.to_v(source)
        if all_perturbed is None:
            all_perturbed = torch.all(perturbation_mask == 0) if perturbation_mask is not None else False
        if all_perturbed:
            hidden_states = value
        else:
            query, key = self._normed_rotated(attn, attn.to_q(hidden_states), attn.to_k(source), query_rotary_emb,
                                              key_rotary_emb)
            hidden_states = self._attention(attn, query, key, value, attention_mask)
            if perturbation_mask is not None:
                hidden_states = torch.lerp(value, hidden_states, perturbation_mask)
        return self._gated_out(attn, hidden_states, gate_logits)


# ---- the block ---------------------------------------------------------------------------


class _Stream:
    """One stream's modules and tables, by the names diffusers gives the video stream's and the
    audio stream's."""

    def __init__(self, module: torch.nn.Module, audio: bool):
        p = "audio_" if audio else ""
        self.norms = [getattr(module, n) for n in (p + "norm1", p + "norm2",
                                                   "video_to_audio_norm" if audio else "audio_to_video_norm",
                                                   p + "norm3")]
        self.attn1, self.attn2, self.ff = getattr(module, p + "attn1"), getattr(module, p + "attn2"), getattr(
            module, p + "ff")
        self.table = getattr(module, p + "scale_shift_table")
        self.ca_table = getattr(module, ("audio" if audio else "video") + "_a2v_cross_attn_scale_shift_table")
        self.prompt_table = getattr(module, p + "prompt_scale_shift_table", None)
        self.text_q = bool(getattr(module, ("audio" if audio else "video") + "_cross_attn_adaln"))

    def fits(self, h, temb, ca_scale_shift, ca_gate) -> bool:
        if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (h, temb, ca_scale_shift, ca_gate)):
            return False
        b, t, d = h.shape
        n = 9 if self.text_q else 6
        weights = [w for w in (getattr(norm, "weight", None) for norm in self.norms) if w is not None]
        if any(not isinstance(w, torch.Tensor) or w.shape != (d,) for w in weights) \
                or any(any_hooks(norm) for norm in self.norms):
            return False
        if self.table.shape != (n, d) or self.ca_table.shape != (5, d):
            return False
        for x, width in ((temb, n * d), (ca_scale_shift, 4 * d), (ca_gate, d)):
            if x.shape[0] != b or x.shape[1] not in (1, t) or x.shape[2] != width:
                return False
        return kiln_can_take(h, temb, ca_scale_shift, ca_gate, self.table, self.ca_table, *weights)

    def weight(self, i: int) -> Optional[torch.Tensor]:
        return getattr(self.norms[i], "weight", None)

    def eps(self, i: int, h: torch.Tensor) -> float:
        return norm_eps(self.norms[i], h)


def _zero_one(cache: dict, h: torch.Tensor):
    d = h.shape[-1]
    return constant(cache, h, lambda: (h.new_zeros(1, 1, d), h.new_ones(d)))


def _seam(s: _Stream, i: int, h, y, gate, scale, shift, rows, consts):
    """(h + y * gate, norm i of it * (1 + scale) + shift) as one kiln.gated_adaln; ``gate`` None
    adds y as it is, ``scale`` None takes the norm alone. ``rows`` (scale, shift): the table rows
    added to scale and shift (the op takes all three rows or none: the others are 0, or 1 for a
    gate of 1)."""
    zero, one = _zero_one(consts, h)
    b, _, d = h.shape
    gate_row = zero[0, 0]
    if gate is None:
        gate, gate_row = zero.expand(b, 1, d), one
    if scale is None:
        scale, shift, rows = zero.expand(b, 1, d), zero.expand(b, 1, d), (zero[0, 0], zero[0, 0])
    return norm_ops.gated_adaln(h, y, gate, scale, shift, s.weight(i), s.eps(i, h), "rms", gate_row, *rows)


def ltx2_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``LTX2VideoTransformerBlock.forward`` with its seams fused (see the module's docstring)."""
    bind = argument_binder(original, defaults=True)
    consts = {}

    def forward(*args, **kwargs):
        if torch.compiler.is_compiling() or records_parameters(module):
            return original(*args, **kwargs)
        a = bind(args, kwargs)
        if a is None:
            return original(*args, **kwargs)
        h, ah = a["hidden_states"], a["audio_hidden_states"]
        # The modules and tables as they are now (an adapter may have wrapped them since the patch).
        video, audio = _Stream(module, audio=False), _Stream(module, audio=True)
        if not (video.fits(h, a["temb"], a["temb_ca_scale_shift"], a["temb_ca_gate"])
                and audio.fits(ah, a["temb_audio"], a["temb_ca_audio_scale_shift"], a["temb_ca_audio_gate"])):
            return original(*args, **kwargs)
        return _forward(module, video, audio, a, consts)

    return forward


def _forward(module, video: _Stream, audio: _Stream, a: dict, consts: dict):
    h, ah = a["hidden_states"], a["audio_hidden_states"]
    batch_size = h.shape[0]
    perturbed = {}
    if module.perturbed_attn:
        perturbed = dict(perturbation_mask=a["perturbation_mask"], all_perturbed=a["all_perturbed"])
    streams = ((video, h, a["temb"], a["video_rotary_emb"], a["self_attention_mask"]),
               (audio, ah, a["temb_audio"], a["audio_rotary_emb"], a["audio_self_attention_mask"]))
    # 1. Self-attention, then h + attn1 * gate and norm2 (LTX-2.3: modulated for the text query).
    state = []
    for s, x, temb, rotary, mask in streams:
        ada = norm_ops.ada_values(temb, s.table.shape[0])
        t = s.table
        normed = norm_ops.adaln(x, ada[:, :, 1], ada[:, :, 0], s.weight(0), s.eps(0, x), "rms", t[1], t[0])
        attn_out = s.attn1(hidden_states=normed, encoder_hidden_states=None, query_rotary_emb=rotary,
                           attention_mask=mask, **perturbed)
        gates = (t[2::3] + ada[:, :, 2::3]).unbind(2)  # gate_msa, gate_mlp (and gate_text_q), as diffusers rounds them
        text_q = (ada[:, :, 7], ada[:, :, 6], (t[7], t[6])) if s.text_q else (None, None, (None, None))
        x, normed = _seam(s, 1, x, attn_out, gates[0], *text_q, consts)
        state.append([x, normed, ada, gates])

    # 2. Cross-attention with the text (its keys and values modulated where LTX-2.3's tables say).
    enc = {}
    if module.cross_attn_adaln:
        for key, table, prompt, like in (("video", module.prompt_scale_shift_table, a["temb_prompt"], h),
                                         ("audio", module.audio_prompt_scale_shift_table, a["temb_prompt_audio"], ah)):
            if prompt is not None:
                enc[key] = module.get_mod_params(table, prompt, batch_size)
            else:
                enc[key] = table[None, None].to(device=like.device, dtype=like.dtype).unbind(dim=2)
    attn2_out = []
    for (s, _, _, _, _), st, key, enc_name, mask_name in (
            (streams[0], state[0], "video", "encoder_hidden_states", "encoder_attention_mask"),
            (streams[1], state[1], "audio", "audio_encoder_hidden_states", "audio_encoder_attention_mask")):
        context = a[enc_name]
        if key in enc:
            shift_kv, scale_kv = enc[key]
            context = context * (1 + scale_kv) + shift_kv
        attn2_out.append(s.attn2(st[1], encoder_hidden_states=context, query_rotary_emb=None,
                                 attention_mask=a[mask_name]))

    # 3. h + attn2 (* gate_text_q) and the audio-video norm: a2v's modulation, then v2a's.
    use_a2v, use_v2a = a["use_a2v_cross_attention"], a["use_v2a_cross_attention"]
    ca = []
    for (s, _, _, _, _), st, out, temb_ss, temb_gate in (
            (streams[0], state[0], attn2_out[0], a["temb_ca_scale_shift"], a["temb_ca_gate"]),
            (streams[1], state[1], attn2_out[1], a["temb_ca_audio_scale_shift"], a["temb_ca_audio_gate"])):
        x, ada, gates = st[0], st[2], st[3]
        gate_text = gates[2] if s.text_q else None
        if not (use_a2v or use_v2a):
            scale_mlp, shift_mlp = ada[:, :, 4], ada[:, :, 3]
            x, st[1] = _seam(s, 3, x, out, gate_text, scale_mlp, shift_mlp, (s.table[4], s.table[3]), consts)
            st[0] = x
            ca.append(None)
            continue
        ca_ada = norm_ops.ada_values(temb_ss, 4)  # a2v scale, a2v shift, v2a scale, v2a shift
        ct = s.ca_table
        first = 0 if use_a2v else 2
        x, mod_first = _seam(s, 2, x, out, gate_text, ca_ada[:, :, first], ca_ada[:, :, first + 1],
                             (ct[first], ct[first + 1]), consts)
        mods = {first: mod_first}
        if use_a2v and use_v2a:
            mods[2] = norm_ops.adaln(x, ca_ada[:, :, 2], ca_ada[:, :, 3], s.weight(2), s.eps(2, x), "rms", ct[2], ct[3])
        ca_gate = ct[4] + temb_gate  # [B, T', D]: the table row plus temb as diffusers rounds it
        st[0] = x
        ca.append((mods, ca_gate))

    # 3.2, 3.3: the audio-video cross-attentions; 4. h + gate * (a2v or v2a), norm3 and the
    # feed-forward's modulation, the feed-forward and its gated residual.
    if use_a2v or use_v2a:
        (v_mods, v_gate), (a_mods, a_gate) = ca
        pending = {"video": None, "audio": None}
        if use_a2v:
            pending["video"] = (module.audio_to_video_attn(
                v_mods[0], encoder_hidden_states=a_mods[0], query_rotary_emb=a["ca_video_rotary_emb"],
                key_rotary_emb=a["ca_audio_rotary_emb"], attention_mask=a["a2v_cross_attention_mask"]), v_gate)
        if use_v2a:
            pending["audio"] = (module.video_to_audio_attn(
                a_mods[2], encoder_hidden_states=v_mods[2], query_rotary_emb=a["ca_audio_rotary_emb"],
                key_rotary_emb=a["ca_video_rotary_emb"], attention_mask=a["v2a_cross_attention_mask"]), a_gate)
        for (s, _, _, _, _), st, key in ((streams[0], state[0], "video"), (streams[1], state[1], "audio")):
            ada, t = st[2], s.table
            if pending[key] is None:
                st[1] = norm_ops.adaln(st[0], ada[:, :, 4], ada[:, :, 3], s.weight(3), s.eps(3, st[0]), "rms",
                                       t[4], t[3])
            else:
                y, gate = pending[key]
                st[0], st[1] = _seam(s, 3, st[0], y, gate, ada[:, :, 4], ada[:, :, 3], (t[4], t[3]), consts)
    results = []
    for (s, _, _, _, _), st in zip(streams, state):
        x, normed, gates = st[0], st[1], st[3]
        ff_out = s.ff(normed)
        if ff_out.shape == x.shape and kiln_can_take(x, ff_out, gates[1]):
            results.append(activation_ops.gated_residual_(x, ff_out, gates[1]))
        else:
            results.append(x + ff_out * gates[1])
    return tuple(results)
