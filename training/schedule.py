"""The learning-rate schedule every training entry point uses: linear warm-up, then cosine to a floor."""
from __future__ import annotations

import math


def warmup_cosine(lr: float, warmup_steps: int, min_lr_ratio: float, step: int, progress: float) -> float:
    """Linear warm-up for `warmup_steps`, then cosine from lr to lr * min_lr_ratio as progress goes 0 -> 1."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
