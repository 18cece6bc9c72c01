"""GGUF K-quant super-blocks (Q4_K, Q6_K) of given weights, packed as llama.cpp's files hold them, for tests: `gguf`'s
Python package dequantizes these types but does not quantize them. The scales are chosen simply (max-based), not by
llama.cpp's search; what matters to the tests is that the bytes are valid K-quants whose dequantized weights are
near the given ones."""
import numpy as np

SUPER = 256


def quantize(weights: np.ndarray, name: str) -> np.ndarray:
    """float32 [n, k] (k % 256 == 0) -> uint8 [n, k / 256 * (144 | 210)], the file's bytes of each row."""
    n, k = weights.shape
    assert k % SUPER == 0, "K-quant rows are whole super-blocks of 256 weights"
    supers = weights.astype(np.float32).reshape(n * k // SUPER, SUPER)
    packed = _q4_k(supers) if name == "Q4_K" else _q6_k(supers)
    return packed.reshape(n, -1)


def _rounded(values: np.ndarray, low: int, high: int) -> np.ndarray:
    return np.clip(np.rint(values), low, high).astype(np.int64)


def _divided(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, dtype=np.float32), where=b != 0)


def _q4_k(supers: np.ndarray) -> np.ndarray:
    subs = supers.reshape(-1, 8, 32)
    low = np.minimum(subs.min(-1), 0.0)  # [S, 8]
    scale, minimum = (subs.max(-1) - low) / 15, -low
    d = (scale.max(-1) / 63).astype(np.float16)  # [S]
    dmin = (minimum.max(-1) / 63).astype(np.float16)
    sc = _rounded(_divided(scale, d.astype(np.float32)[:, None]), 0, 63)
    m = _rounded(_divided(minimum, dmin.astype(np.float32)[:, None]), 0, 63)
    step = d.astype(np.float32)[:, None] * sc
    offset = dmin.astype(np.float32)[:, None] * m
    q = _rounded(_divided(subs + offset[..., None], step[..., None]), 0, 15)  # [S, 8, 32]
    packed = np.zeros((supers.shape[0], 12), dtype=np.int64)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    nibbles = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # bytes 32c + i: sub-blocks 2c (low), 2c + 1 (high)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                           packed.astype(np.uint8), nibbles.astype(np.uint8)], axis=1)


def _q6_k(supers: np.ndarray) -> np.ndarray:
    subs = supers.reshape(-1, 16, 16)
    scale = np.abs(subs).max(-1) / 31  # [S, 16]
    d = (scale.max(-1) / 127).astype(np.float16)
    sc = _rounded(_divided(scale, d.astype(np.float32)[:, None]), -128, 127)
    step = d.astype(np.float32)[:, None] * sc
    q = (_rounded(_divided(subs, step[..., None]), -32, 31) + 32).reshape(-1, 2, 128)  # [S, half, 128], 0..63
    ql = (q[:, :, :64] & 15) | ((q[:, :, 64:] & 15) << 4)  # [S, 2, 64]
    high = (q >> 4).reshape(-1, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)  # [S, 2, 32]
    return np.concatenate([ql.reshape(-1, 128).astype(np.uint8), qh.reshape(-1, 64).astype(np.uint8),
                           sc.astype(np.int8).view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)
