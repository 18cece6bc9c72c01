"""A full-attention cache layer that appends in place: `transformers`' `DynamicLayer` with spare columns.

`DynamicLayer.update` concatenates: every forward copies the layer's whole cache into a new tensor one block longer
(every layer, every step). `AppendInPlaceLayer` keeps its keys and values as views of buffers with up to
`SPARE_COLUMNS` columns to spare, writes a block into the spare columns, and reallocates (one copy) only when they
run out: a copy of the cache every 64 tokens instead of every step. Everything else is `DynamicLayer`'s: `crop`
slices the view (rollback, as before: the next block overwrites the dropped columns), `get_seq_length` reads its
length, and in-place writes to `keys` / `values` (a tree's accepted path, a batch's commit) land in the buffer.
Attention reads the same values through a strided view and computes the same bits (tested against `DynamicLayer`).
Measured on an Intel Xeon with AVX-512 (the reference model, a batch of 8 code prompts, 96 tokens, 5 rounds,
one thread): 1.13x the speed of `DynamicLayer` without drafts, 1.11x at
one draft per row, 1.12x with "auto"; every row identical.

Storage: the committed entries, the largest block verified since the last reallocation, and at most `SPARE_COLUMNS`
more, per row: it follows the longest length reached, never the rejected drafts.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

SPARE_COLUMNS = 64  # columns allocated past a block that runs out of room (a choice: 64 tokens per copy)


class AppendInPlaceLayer(DynamicLayer):
    _key_buffer: torch.Tensor | None = None  # [B, heads, capacity, head_dim]; keys is its [..., :length, :] view
    _value_buffer: torch.Tensor | None = None
    # the capacity its first allocation takes at least (`KVCache.reserve`: a generation's whole length, so the buffers
    # are allocated once and never copied while it decodes)
    reserved: int = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length, block = self.get_seq_length(), key_states.shape[-2]
        if not self._has_room(key_states, value_states, length + block):
            self._reallocate(key_states, value_states, length, length + block + SPARE_COLUMNS)
        self._key_buffer[..., length : length + block, :] = key_states
        self._value_buffer[..., length : length + block, :] = value_states
        self.keys = self._key_buffer[..., : length + block, :]
        self.values = self._value_buffer[..., : length + block, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep these rows (a batch's finished rows leave): the buffers' rows, so later blocks still fit in place."""
        if self.get_seq_length() > 0 and self._holds_views():
            length = self.get_seq_length()
            self._key_buffer, self._value_buffer = self._key_buffer[indices], self._value_buffer[indices]
            self.keys, self.values = self._key_buffer[..., :length, :], self._value_buffer[..., :length, :]
        else:
            super().batch_select_indices(indices)

    def _holds_views(self) -> bool:
        """Whether keys and values are still the prefix views of the buffers (someone may have replaced them: a new
        tensor starts elsewhere, a view of another layout has other strides). Runs at every update: kept cheap."""
        keys, values, key_buffer, value_buffer = self.keys, self.values, self._key_buffer, self._value_buffer
        return (key_buffer is not None and keys.data_ptr() == key_buffer.data_ptr()
                and values.data_ptr() == value_buffer.data_ptr() and keys.stride() == key_buffer.stride()
                and values.stride() == value_buffer.stride())

    def _has_room(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> bool:
        if self.get_seq_length() == 0:  # (an empty or cropped-to-nothing layer: any buffer of the right shape will do)
            buffers = self._key_buffer, self._value_buffer
            return buffers[0] is not None and all(
                buffer.shape[-2] >= needed and buffer.shape[:2] == states.shape[:2]
                and buffer.shape[-1] == states.shape[-1] and buffer.dtype == states.dtype
                for buffer, states in zip(buffers, (key_states, value_states)))
        return (self._holds_views() and self._key_buffer.shape[-2] >= needed
                and self._key_buffer.shape[:2] == key_states.shape[:2])

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, capacity: int) -> None:
        capacity = max(capacity, self.reserved)
        buffers = []
        for held, states in ((self.keys, key_states), (self.values, value_states)):
            buffer = states.new_empty((*states.shape[:-2], capacity, states.shape[-1]))
            if length:
                buffer[..., :length, :] = held
            buffers.append(buffer)
        self._key_buffer, self._value_buffer = buffers


FULL_ATTENTION_LAYERS = (DynamicLayer, AppendInPlaceLayer)  # (types, exactly: sliding windows subclass DynamicLayer)


def append_in_place(hf_cache):
    """`hf_cache` with each plain `DynamicLayer` replaced by an `AppendInPlaceLayer` (before any forward wrote to it;
    other layer kinds, e.g. sliding windows, are kept)."""
    hf_cache.layers = [AppendInPlaceLayer() if type(layer) is DynamicLayer and not layer.is_initialized else layer
                       for layer in hf_cache.layers]
    return hf_cache
