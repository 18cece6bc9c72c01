"""GGUF K-quants (Q4_K, Q6_K) re-blocked exactly into the kernel's blocks of 32 weights, so that their layers stay
quantized instead of loading as float32 (most published GGUF files are Q4_K_M: Q4_K and Q6_K where a row is whole
super-blocks of 256, Q5_0 and Q8_0, which the kernel reads as they are, where it is not, as in SmolLM2's rows of 576).

A K-quant row is super-blocks of 256 weights, each a float16 scale (Q4_K: and a float16 min) times small integer
scales per sub-block (Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins; Q6_K: 16 of 16 with int8 scales). The
kernel's re-blocked form holds, per block of 32 weights, the products of the two scales as float32 (exact: an f16 of
11 significant bits times an integer of at most 8 needs at most 19 bits) and the weights' integers as they were:

    Q4_K -> f32 d, f32 m, 16 bytes of nibbles (Q4_1's layout)   w = d * q + m,  d = d_super * sc, m = -(dmin * min)
    Q6_K -> f32 d0, f32 d1, 32 int8 (q - 32)                     w = d0 * q for the first 16, d1 * q for the last 16

So every weight dequantizes to the float32 value gguf's dequantizer gives (a product, then Q4_K's sum, each rounded as
there), which the loader checks bit for bit as for every kept tensor. The cost is memory: 6 bits a weight for Q4_K's
4.5, 10 for Q6_K's 6.6 (against 32 dequantized). Knows these formats; nothing about modules or kernels.
"""
from __future__ import annotations

import torch

SUPER_WEIGHTS = 256  # weights of one K-quant super-block
SUPER_BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}  # bytes of one super-block in the file (gguf.GGML_QUANT_SIZES)


def reblocked(name: str, data: torch.Tensor) -> torch.Tensor:
    """A K-quant tensor's rows as the file holds them (uint8 [rows, whole super-blocks]) -> the kernel's rows of the
    same type name (uint8 [rows, in_features / 32 * its block bytes: `quantized.BLOCK_BYTES`])."""
    if name not in SUPER_BLOCK_BYTES:
        raise ValueError(f"GGUF type {name!r}: selfspec re-blocks only {tuple(SUPER_BLOCK_BYTES)}")
    rows, row_bytes = data.shape
    size = SUPER_BLOCK_BYTES[name]
    if data.dtype != torch.uint8 or row_bytes % size:
        raise ValueError(f"{name} rows {tuple(data.shape)} {data.dtype}: expected uint8 rows of whole blocks "
                         f"({size} bytes each)")
    blocks = data.reshape(rows, -1, size)  # [rows, S, bytes]
    kept = _q4_k(blocks) if name == "Q4_K" else _q6_k(blocks)
    return kept.reshape(rows, -1).contiguous()


def _half(raw: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] float32 (float16 values widened, exactly)."""
    return raw.contiguous().view(torch.float16)[..., 0].float()


def _as_bytes(values: torch.Tensor) -> torch.Tensor:
    """[..., n] float32 -> [..., 4n] uint8."""
    return values.contiguous().view(torch.uint8)


def _q4_k(supers: torch.Tensor) -> torch.Tensor:
    """Q4_K super-blocks [rows, S, 144]: f16 d, f16 dmin, 12 bytes packing 8 6-bit scales and 8 6-bit mins, 128
    bytes of nibbles (bytes 32c .. 32c + 31: sub-block 2c in the low nibbles, 2c + 1 in the high)."""
    d, dmin, packed, nibbles = _half(supers[..., 0:2]), _half(supers[..., 2:4]), supers[..., 4:16], supers[..., 16:]
    low_six, high_bits = packed[..., 0:8] & 63, packed[..., 0:8] >> 6  # bytes 0..3 (scales), 4..7 (mins)
    last = packed[..., 8:12]
    scale = torch.cat([low_six[..., 0:4], (last & 15) | (high_bits[..., 0:4] << 4)], dim=-1).float()  # [rows, S, 8]
    minimum = torch.cat([low_six[..., 4:8], (last >> 4) | (high_bits[..., 4:8] << 4)], dim=-1).float()
    block_d = d[..., None] * scale  # exact in float32
    block_m = -(dmin[..., None] * minimum)
    chunks = nibbles.reshape(*nibbles.shape[:-1], 4, 32)
    q = torch.stack([chunks & 15, chunks >> 4], dim=-2).reshape(*nibbles.shape[:-1], 8, 32)  # [rows, S, 8, 32]
    packed_q = q[..., :16] | (q[..., 16:] << 4)  # Q4_1's layout: byte j holds weights j and 16 + j
    return torch.cat([_as_bytes(block_d[..., None]), _as_bytes(block_m[..., None]), packed_q], dim=-1)


def _q6_k(supers: torch.Tensor) -> torch.Tensor:
    """Q6_K super-blocks [rows, S, 210]: 128 bytes of the low four bits (per half of 128 weights: 64 bytes, the low
    nibbles weights 0..63, the high 64..127), 64 bytes of the high two bits (per half: 32 bytes, bits 2s..2s+1 of byte
    i for weight 32s + i), 16 int8 scales (one per 16 weights), f16 d."""
    lead = supers.shape[:-1]
    ql, qh, scales, d = supers[..., :128], supers[..., 128:192], supers[..., 192:208], _half(supers[..., 208:210])
    low = ql.reshape(*lead, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8).reshape(2, 1)
    high = qh.reshape(*lead, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(4, 1)
    q = ((low & 15).reshape(*lead, 256) | ((high & 3).reshape(*lead, 256) << 4)).to(torch.int8) - 32  # [-32, 31]
    sub_d = d[..., None] * scales.contiguous().view(torch.int8).float()  # [rows, S, 16], exact in float32
    pairs = sub_d.reshape(*lead, 8, 2)
    return torch.cat([_as_bytes(pairs), q.reshape(*lead, 8, 32).view(torch.uint8)], dim=-1)
