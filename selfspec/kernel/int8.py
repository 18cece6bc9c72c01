"""llama.cpp's method for kept GGUF blocks: each row of x rounded to int8 per block of 32 with a float scale, the
blocks multiplied in integers by the kernel's `quantized_linear_int8` (AVX-512 VNNI, AVX2 or scalar, chosen at run
time; every path computes the same sums in the same order, bit for bit), for any number of rows. Not the dequantized
layer's function, since x is rounded; each row's result is independent of the rows beside it, which is what the
engine's exactness needs. Knows the kernel's entry points; nothing about models or which backend a layer uses
(`backends.py`)."""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from selfspec.kernel import few_row_linear

# The int8 kernel's code paths, by the kernel's numbering; every one computes the same sums (bit for bit).
INT8_PATHS = ("scalar", "avx2", "vnni")


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
    """x [..., in_features] (float32, CPU) times the blocks of `weight`, x rounded to int8 per block of 32 and the
    blocks multiplied in integers (the kernel's `quantized_linear_int8`, any number of rows). path: one of
    `int8_paths()` (tests force each one), or None for the best this CPU has."""
    linear = _int8_entry_points()[0]
    if x.dtype is not torch.float32 or not x.is_cpu or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype}: expected float32 CPU rows of {weight.shape[1]}")
    code = -1 if path is None else INT8_PATHS.index(path) if path in INT8_PATHS else None
    if code is None:
        raise ValueError(f"path={path!r}: expected one of {INT8_PATHS} or None")
    x_rows = x.detach().contiguous()
    out = x.new_empty((*x.shape[:-1], weight.shape[0]))
    status = linear(weight.qtype, code, x_rows.data_ptr(), x.numel() // weight.shape[1], weight.shape[1],
                    weight.blocks.data_ptr(), weight.shape[0], out.data_ptr())
    if status == -2:
        raise ValueError(f"the int8 kernel's {path} path needs instructions this CPU lacks (it has {int8_paths()})")
    if status:
        raise RuntimeError(f"the int8 kernel failed ({status})")
    return out
