"""Fake (meta) implementations of the RoPE ops: outputs are new tensors of q's and k's
shapes and dtype, laid out as rope_output (bindings/torch/rope.h) lays them out; the
in-place op returns nothing."""

import torch


def rope_output(x):
    """x's layout (empty_like) where that has a unit last stride, else contiguous: what
    kiln's rope kernels write (bindings/torch/rope.h, rope_output)."""
    out = torch.empty_like(x)
    return out if out.stride(-1) == 1 else x.new_empty(x.shape)


def _same_device(op, q, **tensors):
    # A meta tensor among real ones dispatches here, so devices are checked here too, with
    # the message the real implementations give.
    for name, t in tensors.items():
        if t is not None and t.device != q.device:
            raise ValueError(f"kiln.{op}: {name}: expected device {q.device} (as q), got {t.device}")


def _rope_shape_checks(q, k, layout, cos=None, sin=None, interleaved=False, deinterleave=False):
    _same_device("rope", q, k=k, cos=cos, sin=sin)
    torch._check_value(not (interleaved and deinterleave),
                       lambda: "kiln.rope: deinterleave: expected false with interleaved=True (it de-interleaves "
                               "pairs for a rotate_half rotation), got true")
    torch._check(layout in ("bhsd", "bshd"),
                 lambda: f'kiln.rope: layout: expected "bhsd" or "bshd", got "{layout}"')
    torch._check(k.dtype == q.dtype,
                 lambda: f"kiln.rope: k: expected dtype {q.dtype} (as q), got {k.dtype}")
    torch._check(q.dim() == k.dim() and q.dim() in (3, 4),
                 lambda: f"kiln.rope: q, k: expected 4 dimensions (or 3 in bshd), got {q.dim()}, {k.dim()}")


@torch.library.register_fake("kiln::rope")
def _rope_fake(q, k, cos, sin, interleaved=False, rotary_dim=-1, layout="bhsd", head_dim=-1,
               deinterleave=False):
    _rope_shape_checks(q, k, layout, cos, sin, interleaved, deinterleave)
    return rope_output(q), rope_output(k)


@torch.library.register_fake("kiln::rope_")
def _rope_inplace_fake(q, k, cos, sin, interleaved=False, rotary_dim=-1, layout="bhsd", head_dim=-1,
                       deinterleave=False):
    _rope_shape_checks(q, k, layout, cos, sin, interleaved, deinterleave)
    return None


def _head_norm_checks(q, k, layout, q_weight, k_weight, cos, sin):
    _same_device("head_norm_rope", q, k=k, q_weight=q_weight, k_weight=k_weight, cos=cos, sin=sin)
    _rope_shape_checks(q, k, layout, cos, sin)
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w is not None:
            torch._check(w.dtype == q.dtype,
                         lambda: f"kiln.head_norm_rope: {name}: expected dtype {q.dtype} (as q), got {w.dtype}")
            torch._check(w.dim() == 1,
                         lambda: f"kiln.head_norm_rope: {name}: expected [D] (the head dim), got {list(w.shape)}")


@torch.library.register_fake("kiln::head_norm_rope")
def _head_norm_rope_fake(q, k, q_weight, k_weight, cos, sin, eps=1e-6, interleaved=False,
                         rotary_dim=-1, layout="bhsd", head_dim=-1):
    _head_norm_checks(q, k, layout, q_weight, k_weight, cos, sin)
    return rope_output(q), rope_output(k)


@torch.library.register_fake("kiln::head_norm_rope_")
def _head_norm_rope_inplace_fake(q, k, q_weight, k_weight, cos, sin, eps=1e-6, interleaved=False,
                                 rotary_dim=-1, layout="bhsd", head_dim=-1):
    _head_norm_checks(q, k, layout, q_weight, k_weight, cos, sin)
    return None


@torch.library.register_fake("kiln::rope_3d")
def _rope_3d_fake(q, k, grid, rope_interpolation_scale=None, base_sizes=(20, 2048, 2048),
                  patch_sizes=(1, 1), theta=10000.0):
    _same_device("rope_3d", q, k=k)
    torch._check(q.dim() == 3 and k.shape == q.shape,
                 lambda: f"kiln.rope_3d: k: expected q's shape {list(q.shape)}, got {list(k.shape)}")
    return q.new_empty(q.shape), k.new_empty(k.shape)


@torch.library.register_fake("kiln::rms_norm_rope")
def _rms_norm_rope_fake(q, k, q_weight, k_weight, eps=1e-5, cos=None, sin=None, grid=None,
                        rope_interpolation_scale=None, base_sizes=(20, 2048, 2048),
                        patch_sizes=(1, 1), theta=10000.0, head_dim=-1):
    _same_device("rms_norm_rope", q, k=k, cos=cos, sin=sin)
    torch._check(q.dim() == 3 and k.shape == q.shape,
                 lambda: f"kiln.rms_norm_rope: k: expected q's shape {list(q.shape)}, got {list(k.shape)}")
    # The table checks the ops make, so a call they refuse is refused while tracing too.
    width = q.shape[-1]
    if head_dim != -1:
        torch._check_value(grid is None, lambda: f"kiln.rms_norm_rope: head_dim: expected -1 with a video grid, "
                                                 f"got {head_dim}")
        torch._check_value(head_dim >= 4 and head_dim % 4 == 0 and width % head_dim == 0,
                           lambda: f"kiln.rms_norm_rope: head_dim: expected -1 or a multiple of 4 dividing q's "
                                   f"width {width}, got {head_dim}")
    if cos is not None:
        angles = width if head_dim == -1 else head_dim // 2
        torch._check_value(cos.shape[-1] == angles,
                           lambda: "kiln.rms_norm_rope: cos: expected a last dimension of "
                                   + (f"q's width {width} (the rotation spans the row)" if head_dim == -1 else
                                      f"head_dim / 2 = {angles} (one angle a rotation pair of each head)")
                                   + f", got {list(cos.shape)}")
    return q.new_empty(q.shape), k.new_empty(k.shape)
