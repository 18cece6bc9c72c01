"""Which of PyTorch's attention kernels the engine's forwards may use: on CUDA, every one but cuDNN's.

Measured on an H200 (SmolLM2, bfloat16, `examples/gpu/`): with cuDNN's scaled-dot-product attention allowed, a
forward over several tokens with a mask cost 1.5-3.7 one-token decodes where it costs 1.2-1.4 without it (EAGLE
at a fixed k = 3: 0.72x of `generate` with it, 1.67x without), as if a plan were built for every new (query length,
cache length) pair: a decode step's cache is one step longer each time. Plain one-token decoding was not slowed.
The other kernels compute the same attention; only speed changes. Applied per resumption of the engine's decode
generators, so the caller's code between two steps runs under its own settings. CPUs are left as they are.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# Every backend but cuDNN's (and ERROR, which is not one).
_ALLOWED = [b for name, b in SDPBackend.__members__.items() if name not in ("CUDNN_ATTENTION", "ERROR")]


def without_cudnn_attention(steps: Iterator, device: torch.device) -> Iterator:
    """Yield what `steps` yields, running each of its resumptions with cuDNN's attention kernel disallowed (CUDA
    only; elsewhere `steps` itself)."""
    if torch.device(device).type != "cuda":
        return steps
    return _each_step_without_cudnn(steps)


def _each_step_without_cudnn(steps: Iterator) -> Iterator:
    while True:
        with sdpa_kernel(_ALLOWED):
            try:
                item = next(steps)
            except StopIteration:
                return
        yield item
