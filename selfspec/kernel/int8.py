"""llama.cpp's method for kept GGUF blocks: each row of x rounded to int8 per block of 32 with a float scale, the
blocks multiplied in integers by the kernel's `quantized_linear_int8` (AVX-512 VNNI, AVX2 or scalar, chosen at run
time; every path computes the same sums in the same order, bit for bit), for any number of rows. Not the dequantized
layer's function, since x is rounded; each row's result is independent of the rows beside it, which is what the
engine's exactness needs. The kernel reads weights whose rows are interleaved eight at a time (`interleave`: the
file's bytes permuted, so that one vector load holds four weights of eight rows; `deinterleave` undoes it).
Knows the kernel's entry points and that layout; nothing about models or which backend a layer uses (`backends.py`)."""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from selfspec.kernel import few_row_linear

# The int8 kernel's code paths, by the kernel's numbering; every one computes the same sums (bit for bit).
INT8_PATHS = ("scalar", "avx2", "vnni")
GROUP_ROWS = 8  # weight rows interleaved together (the kernel's GROUP_ROWS)


def interleave(blocks: torch.Tensor, qtype: int) -> torch.Tensor:
    """GGUF rows [n, row bytes] (uint8) -> the same bytes in the int8 kernel's layout: full groups of GROUP_ROWS rows,
    each block of a group its eight rows' scales (then their second scales: Q4_1's and Q4_K's mins, Q6_K's d of its
    second half-block; Q5_0: their 32-bit words of fifth bits), then their quantized bytes in chunks of four (chunk c
    of rows 0..7, then chunk c + 1); the last n % 8 rows as they were."""
    return _permuted(blocks, qtype, inverse=False)


def deinterleave(blocks: torch.Tensor, qtype: int) -> torch.Tensor:
    """`interleave`'s inverse: the file's rows back."""
    return _permuted(blocks, qtype, inverse=True)


def _permuted(blocks: torch.Tensor, qtype: int, inverse: bool) -> torch.Tensor:
    from selfspec.kernel.quantized import BLOCK_BYTES, header_fields  # (quantized.py imports this module)

    block_bytes, fields = BLOCK_BYTES[qtype], header_fields(qtype)  # the fields opening a block, in bytes each
    header = sum(fields)
    chunks = (block_bytes - header) // 4
    n_rows, row_bytes = blocks.shape
    groups, per_row = n_rows // GROUP_ROWS, row_bytes // block_bytes
    out = blocks.clone()
    if groups:
        grouped = blocks[:groups * GROUP_ROWS]
        parts, at = [], 0  # each header field of the eight rows in turn, then the chunks: [G, blocks, bytes]
        if not inverse:  # [G, 8, blocks, bytes] -> [G, blocks, (8, field) for each field + (chunks, 8, 4)]
            by_row = grouped.reshape(groups, GROUP_ROWS, per_row, block_bytes)
            for size in fields:
                parts.append(by_row[..., at:at + size].permute(0, 2, 1, 3).reshape(groups, per_row, -1))
                at += size
            quants = by_row[..., header:].reshape(groups, GROUP_ROWS, per_row, chunks, 4).permute(0, 2, 3, 1, 4)
            parts.append(quants.reshape(groups, per_row, -1))
        else:  # and back: [G, 8, blocks, (field for each field) + (chunks, 4)]
            by_block = grouped.reshape(groups, per_row, GROUP_ROWS * block_bytes)
            for size in fields:
                field = by_block[..., GROUP_ROWS * at:GROUP_ROWS * (at + size)].reshape(groups, per_row, GROUP_ROWS, size)
                parts.append(field.permute(0, 2, 1, 3))
                at += size
            quants = by_block[..., GROUP_ROWS * header:].reshape(groups, per_row, chunks, GROUP_ROWS, 4)
            parts.append(quants.permute(0, 3, 1, 2, 4).reshape(groups, GROUP_ROWS, per_row, -1))
        out[:groups * GROUP_ROWS] = torch.cat(parts, dim=-1).reshape(groups * GROUP_ROWS, row_bytes)
    return out


def q8_0_blocks(weight: torch.Tensor) -> torch.Tensor:
    """A float32 weight [N, K] (K % 32 == 0) rounded to GGUF Q8_0 blocks [N, K / 32 * 34] (uint8, the file's layout):
    per block of 32 along a row a float16 scale d = max |w| / 127 and the 32 int8 values round(w / d)."""
    n_rows, k_dim = weight.shape
    if k_dim % 32:
        raise ValueError(f"Q8_0 blocks need a multiple of 32 weights a row; this weight has {k_dim}")
    blocks = weight.reshape(n_rows, k_dim // 32, 32)
    scale = (blocks.abs().amax(dim=-1, keepdim=True) / 127).to(torch.float16)
    inverse = torch.where(scale == 0, 0.0, 1.0 / scale.float())
    values = (blocks * inverse).round().clamp(-127, 127).to(torch.int8)
    return torch.cat([scale.view(torch.uint8), values.view(torch.uint8)], dim=-1).reshape(n_rows, -1).contiguous()


@lru_cache(maxsize=1)
def _int8_entry_points():
    """(quantized_linear_int8, quantized_int8_paths) of the kernel's library; raises where it is unavailable."""
    library = few_row_linear._kernel_library()
    if library is None:
        raise RuntimeError(f"selfspec's quantized kernel is unavailable: {few_row_linear.unavailable_reason()}")
    linear, paths = library.quantized_linear_int8, library.quantized_int8_paths
    linear.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                       ctypes.c_long, ctypes.c_void_p]
    linear.restype = paths.restype = ctypes.c_int
    return linear, paths


def int8_paths() -> tuple[str, ...]:
    """The int8 kernel's code paths this CPU has (INT8_PATHS' names; "scalar" always), the last the one it takes."""
    mask = _int8_entry_points()[1]()
    return tuple(name for code, name in enumerate(INT8_PATHS) if mask >> code & 1)


def int8_linear(x: torch.Tensor, weight: "QuantizedWeight", path: str | None = None) -> torch.Tensor:
    """x [..., in_features] (float32, CPU) times the blocks of `weight` (interleaved: `weight.set_interleaved(True)`),
    x rounded to int8 per block of 32 and the blocks multiplied in integers (the kernel's `quantized_linear_int8`, any
    number of rows). path: one of `int8_paths()` (tests force each one), or None for the best this CPU has."""
    linear = _int8_entry_points()[0]
    if x.dtype is not torch.float32 or not x.is_cpu or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype}: expected float32 CPU rows of {weight.shape[1]}")
    code = -1 if path is None else INT8_PATHS.index(path) if path in INT8_PATHS else None
    if code is None:
        raise ValueError(f"path={path!r}: expected one of {INT8_PATHS} or None")
    if not weight.interleaved:
        raise ValueError(f"{weight!r} is in the file's layout; the int8 kernel reads interleaved rows: "
                         "weight.set_interleaved(True) first (QuantizedLinear(backend='int8') does)")
    x_rows = x.detach().contiguous()
    out = x.new_empty((*x.shape[:-1], weight.shape[0]))
    status = linear(weight.qtype, code, x_rows.data_ptr(), x.numel() // weight.shape[1], weight.shape[1],
                    weight.blocks.data_ptr(), weight.shape[0], out.data_ptr())
    if status == -2:
        raise ValueError(f"the int8 kernel's {path} path needs instructions this CPU lacks (it has {int8_paths()})")
    if status:
        raise RuntimeError(f"the int8 kernel failed ({status})")
    return out
