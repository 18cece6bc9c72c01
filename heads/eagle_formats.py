"""Other checkpoint layouts for EAGLE heads: recognised, and refused with the reason (not loaded yet).

Published EAGLE-1/2 draft heads (e.g. `yuhuili/EAGLE-llama2-chat-7B`: a Llama config with one layer, weights
`fc.weight` [H, 2H] over cat(embedding, feature), `layers.0.*` without the first input norm) read the base's
PRE-norm last-layer features and send their output through the base's final norm; selfspec's EagleHead reads the
POST-norm features the engine already has (what the LM head reads) and ends in its own norm. Mapping one onto the
other needs the engine to expose pre-norm features, which it does not yet. Knows file layouts only.
"""
from __future__ import annotations

import os

PUBLISHED_WEIGHTS = ("pytorch_model.bin", "model.safetensors")


def looks_like_published_eagle(directory, raw_config: dict) -> bool:
    has_weights = any(os.path.isfile(os.path.join(directory, name)) for name in PUBLISHED_WEIGHTS)
    return has_weights and raw_config.get("num_hidden_layers") == 1 and "hidden_size" in raw_config


def load_published_eagle(directory, raw_config: dict, model=None, check_base: bool = True):
    if looks_like_published_eagle(directory, raw_config):
        raise NotImplementedError(
            f"{directory!r} looks like a published EAGLE-1/2 head. Those read the base's pre-norm features, selfspec's "
            "EagleHead reads post-norm ones, so they cannot be loaded yet (see README, Limitations). Train a head for "
            "your model with `python -m training.heads --kind eagle`."
        )
    raise ValueError(
        f"{directory!r} holds {raw_config.get('format', 'an unknown format')!r}, not an EAGLE head saved by selfspec "
        "(config.json format 'selfspec-eagle')"
    )
