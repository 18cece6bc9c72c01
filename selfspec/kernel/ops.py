"""The quantized products (and an embedding's row lookup) as registered torch ops, `torch.ops.selfspec.quantized_linear`
(`quantized_rows`), so that a compiled forward
(`torch.compile(..., fullgraph=True)`) holds each product as one opaque call instead of breaking its graph at the
kernel's ctypes call. `QuantizedLinear.forward` takes it only while torch compiles: in eager forwards a registered
op's dispatch costs several microseconds a call (SmolLM2 makes 211 products a token), so they call the kernel directly.
Knows the op's schema; the arithmetic is `quantized.py`'s and `int8.py`'s."""
from __future__ import annotations

import torch


@torch.library.custom_op("selfspec::quantized_linear", mutates_args=())
def quantized_linear(x: torch.Tensor, blocks: torch.Tensor, qtype: int, in_features: int,
                     interleaved: bool) -> torch.Tensor:
    """x [..., in_features] times the GGUF blocks `blocks` [out_features, row bytes] of type `qtype`: int8 products
    over interleaved blocks (`int8.int8_linear`), else the float path (`quantized.QuantizedLinear`'s)."""
    from selfspec.kernel.quantized import QuantizedLinear, QuantizedWeight

    weight = QuantizedWeight(blocks, qtype, in_features)
    weight.interleaved = interleaved  # (the layout the caller's weight is in; nothing is permuted here)
    return QuantizedLinear.eager_product(x, weight, "int8" if interleaved else "float")


@quantized_linear.register_fake
def _(x, blocks, qtype, in_features, interleaved):
    return x.new_empty((*x.shape[:-1], blocks.shape[0]))


@torch.library.custom_op("selfspec::quantized_rows", mutates_args=())
def quantized_rows(ids: torch.Tensor, blocks: torch.Tensor, qtype: int, in_features: int,
                   interleaved: bool) -> torch.Tensor:
    """[*ids.shape, in_features] float32: the dequantized rows `ids` of the GGUF blocks (an embedding's lookup)."""
    from selfspec.kernel.quantized import QuantizedWeight

    weight = QuantizedWeight(blocks, qtype, in_features)
    weight.interleaved = interleaved
    return weight.rows(ids.reshape(-1)).view(*ids.shape, in_features)


@quantized_rows.register_fake
def _(ids, blocks, qtype, in_features, interleaved):
    return torch.empty((*ids.shape, in_features), dtype=torch.float32, device=blocks.device)
