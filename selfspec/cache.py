"""The one KV cache that drafting and verification share; it owns the valid length, rollback moves it.

Built on `transformers`' `DynamicCache` so every decoder family works unchanged, its full-attention layers appending
in place (`cache_layer.py`). Rollback crops each layer's keys and values to the committed length (slicing only:
nothing is copied, and the next write replaces the dropped tail, so memory never grows with rejected drafts). Knows
nothing about drafts or sampling.
"""
from __future__ import annotations

from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from selfspec.cache_layer import FULL_ATTENTION_LAYERS, AppendInPlaceLayer, append_in_place


class KVCache:
    def __init__(self, model, hf_cache: DynamicCache | None = None):
        """The cache of `model` (a fresh DynamicCache for its config), or `hf_cache` when given (a drafting head's own
        cache, built from the head's config); `model` then only names the owner in errors."""
        self.hf_cache = append_in_place(DynamicCache(config=model.config) if hf_cache is None else hf_cache)
        for layer in self.hf_cache.layers:
            if isinstance(layer, DynamicSlidingWindowLayer):
                # Keep the tokens a rollback may need to restore; `crop` trims back to the window afterwards.
                layer.activate_past_recording()
            elif type(layer) not in FULL_ATTENTION_LAYERS:
                raise NotImplementedError(
                    f"{type(model).__name__} uses a {type(layer).__name__} cache layer, whose state cannot be rolled "
                    "back by length; selfspec supports attention-only decoders (Llama, Mistral, Qwen, Gemma, Phi, "
                    "GPT-2, ...)."
                )

    def reserve(self, tokens: int) -> None:
        """Allocate room for `tokens` entries a layer at the first write (a prompt, its new tokens and the widest verify
        block): the buffers are then written by position and never reallocated or copied while decoding."""
        for layer in self.hf_cache.layers:
            if isinstance(layer, AppendInPlaceLayer):
                layer.reserved = tokens

    def layer_length(self, layer_idx: int) -> int:
        return self.hf_cache.layers[layer_idx].get_seq_length()

    @property
    def length(self) -> int:
        """Tokens held by every layer (layers differ only transiently, while an early-exit draft is in flight)."""
        return min(self.layer_length(i) for i in range(len(self.hf_cache.layers)))

    def rollback(self, length: int) -> None:
        """Cut every layer back to its first `length` tokens."""
        for layer in self.hf_cache.layers:
            excess = layer.get_seq_length() - length
            if excess < 0:
                raise ValueError(f"cannot roll a cache of {layer.get_seq_length()} tokens forward to {length}")
            layer.crop(-excess)  # crop(-n) removes n tokens; crop(0) is a no-op (or re-trims a sliding window)

    def nbytes(self) -> int:
        """Bytes of storage the cache's tensors hold (what rollback must keep bounded)."""
        total = 0
        for layer in self.hf_cache.layers:
            if layer.is_initialized:
                total += layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()
        return total
