"""The one keyword `transformers` renamed under selfspec: how a decoder, a decoder layer and the mask builder take
the KV cache (`cache=` in recent releases, `past_key_values=` in earlier 5.x ones, which vLLM and speculators pin).
Read once from transformers' own signature; knows nothing else about models."""
from __future__ import annotations

import inspect

from transformers.masking_utils import create_causal_mask

CACHE_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def cache_arg(cache) -> dict:
    """{keyword: cache} for a call into transformers' decoders, layers and `create_causal_mask`."""
    return {CACHE_ARG: cache}
