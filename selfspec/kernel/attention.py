"""Attention in one fixed order (the kernel's `ordered_attention`): each query's output computed alone, by the same
float operations over the keys it sees in position order, so it is the same bits whether the query is decoded alone,
verified beside drafts, or computed in a batch's ragged rows. PyTorch's attention rounds a query's output differently
for different numbers of queries (an ulp); float32 products carry that ulp along harmlessly, but products that round
activations to int8 (`int8.py`) can turn it into a whole int8 step and a greedy token at a near-tie into another. The
engine runs its decode and verify forwards through this where its model has such products (`attention_backends.py`).
Knows the kernel's entry point and `transformers`' attention-function signature; nothing about models."""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from selfspec.kernel import few_row_linear


@lru_cache(maxsize=1)
def _entry_point():
    library = few_row_linear._kernel_library()
    if library is None:
        raise RuntimeError(f"selfspec's kernel is unavailable: {few_row_linear.unavailable_reason()}")
    attend = library.ordered_attention
    attend.argtypes = ([ctypes.c_void_p] + [ctypes.c_long] * 4 + [ctypes.c_void_p] * 2 + [ctypes.c_long] * 8
                       + [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p])
    attend.restype = ctypes.c_int
    return attend


def ordered_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor | None,
                      scale: float) -> torch.Tensor:
    """query [B, H, W, D] (float32, CPU), key / value [B, Hkv, L, D] (the last dimension contiguous; grouped heads as
    they are), visible [B, W, L] bool (None: causal, query i sees the first L - W + i + 1 keys) -> [B, W, H, D]."""
    B, H, W, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    if (query.dtype is not torch.float32 or key.dtype is not torch.float32 or value.dtype is not torch.float32
            or key.stride(-1) != 1 or value.stride(-1) != 1 or D % 8 or H % Hkv):
        raise ValueError("ordered attention takes float32 queries, keys and values with contiguous rows, head_dim % 8 "
                         "== 0 and whole groups of query heads")
    query = query.contiguous()
    mask = None if visible is None else visible.to(torch.uint8).contiguous()
    out = query.new_empty((B, W, H, D))
    status = _entry_point()(query.data_ptr(), B, H, W, D, key.data_ptr(), value.data_ptr(), Hkv, L, key.stride(0),
                            key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
                            None if mask is None else mask.data_ptr(), scale, out.data_ptr())
    if status:
        raise RuntimeError(f"the kernel's ordered attention failed ({status})")
    return out


def visible_keys(attention_mask: torch.Tensor | None, batch: int, width: int, length: int,
                 causal: bool = True) -> tuple[bool, torch.Tensor | None]:
    """`transformers`' attention mask for `width` queries over `length` keys -> (True, what `ordered_attention` takes:
    visible [batch, width, length] bool, or None for causal), or (False, None) where the mask is not one it takes
    (an additive bias rather than 0 / -inf, another shape; no mask over several queries of a non-causal module)."""
    if attention_mask is None:
        return (False, None) if width > 1 and not causal else (True, None)
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or attention_mask.shape[-1] != length:
        return False, None
    mask = attention_mask[:, 0, -width:]  # [B or 1, W, L]
    if mask.dtype is torch.bool:
        visible = mask
    else:
        visible = mask == 0
        if bool(((mask != 0) & (mask > torch.finfo(mask.dtype).min / 2)).any()):
            return False, None  # (an additive bias, not a mask)
    return True, visible.expand(batch, width, length)


def ordered_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs):
    """`transformers`' sdpa attention function's contract, through `ordered_attention`: (output [B, W, H, D], None);
    or None where it does not apply (a mask that is a bias rather than 0 / -inf, dropout, softcapping, position
    biases, attention weights asked, another dtype or device), for the caller's own function to compute."""
    if (dropout or not query.is_cpu or query.dtype is not torch.float32 or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None or kwargs.get("output_attentions") or kwargs.get("sinks") is not None
            or key.stride(-1) != 1 or value.stride(-1) != 1 or query.shape[-1] % 8
            or query.shape[1] % key.shape[1] or torch.compiler.is_compiling()):
        return None
    B, _, W, _ = query.shape
    applies, visible = visible_keys(attention_mask, B, W, key.shape[2], getattr(module, "is_causal", True))
    if not applies:
        return None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return ordered_attention(query, key, value, visible, float(scale)), None
