"""One KV cache for a batch of sequences of different lengths (ragged rows); it owns each row's committed length.

Built on one `transformers` `DynamicCache` of batch size B (its layers append in place, `cache_layer.py`). Rows are
left-aligned: row r's committed entries sit at columns [0, lengths[r]); the cache is `width` = max(lengths) columns
wide, and the columns of row r past its length hold stale entries that its queries never see. A forward appends a
block of n columns for every row at the end [width, width + n); `block_mask` lets query i of row r attend to the
row's committed prefix and to its own block entries 0..i, nothing else, and `block_positions` puts it at position
lengths[r] + i, so each row computes exactly what it would alone. `commit` then moves each row's kept block entries
(the first kept[r]) down to [lengths[r], lengths[r] + kept[r]) and crops the cache to the new widest row: rejected
drafts and stale tails never grow memory. `rollback` cuts rows back to shorter lengths (a drafter that committed
entries on its own guesses); `select` drops finished rows; `join` appends rows (a server's new requests). Knows nothing about drafts, sampling or the model's outputs.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from selfspec.attention_backends import additive_mask
from selfspec.cache_layer import FULL_ATTENTION_LAYERS, append_in_place


class RaggedCache:
    def __init__(self, model, batch_size: int, device, config=None):
        """The cache of `model` (its config), or of `config` when given (a drafting head's layer config; `model` then
        only names the owner in errors)."""
        self.hf_cache = append_in_place(DynamicCache(config=model.config if config is None else config))
        kinds = sorted({type(layer).__name__ for layer in self.hf_cache.layers
                        if type(layer) not in FULL_ATTENTION_LAYERS})
        if kinds:
            raise NotImplementedError(
                f"batched decoding needs full-attention cache layers (one mask serves every layer); "
                f"{type(model).__name__} uses {kinds}. Decode its prompts one by one."
            )
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] committed entries per row
        self.width = 0  # columns after the last commit or select: max(lengths); a forward's block starts here

    @classmethod
    def holding(cls, model, hf_cache, length: int) -> "RaggedCache":
        """One row whose `length` entries a single sequence's cache (`KVCache.hf_cache`) holds, taken over as they are."""
        cache = cls(model, 1, hf_cache.layers[0].keys.device if hf_cache.layers[0].is_initialized else "cpu")
        cache.hf_cache = hf_cache
        cache.lengths = torch.tensor([length], dtype=torch.long, device=cache.lengths.device)
        cache.width = length
        return cache

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def block_positions(self, block_width: int, first: int = 0) -> torch.Tensor:
        """[B, block_width] position ids of the next block's entries first .. first + block_width - 1: row r's entry
        i sits at lengths[r] + i."""
        return self.lengths[:, None] + torch.arange(first, first + block_width, device=self.lengths.device)

    def block_mask(self, block_width: int, dtype: torch.dtype, first: int = 0) -> torch.Tensor:
        """[B, 1, block_width, width + first + block_width] additive mask (0 attended, finfo(dtype).min not) for the
        block's entries first .. first + block_width - 1, appended after the current columns and the block's `first`
        entries (early exit drafts a block one entry at a time in its first layers); in the model's dtype, since
        eager attention adds it to the scores."""
        width, device = self.width, self.lengths.device
        columns = torch.arange(width + first + block_width, device=device)  # [width + first + n]
        queries = torch.arange(first, first + block_width, device=device)  # [n]
        committed = columns[None, None, :] < self.lengths[:, None, None]  # [B, 1, columns]
        own_block = (columns[None, :] >= width) & (columns[None, :] - width <= queries[:, None])  # [n, columns]
        attended = committed | own_block[None]  # [B, n, columns]
        return additive_mask(attended, dtype)[:, None]

    def commit(self, kept: torch.Tensor) -> None:
        """After a forward appended a block: keep each row's first kept[r] block entries ([B] long), moved to follow
        its committed prefix, and crop to the widest row. Entries past kept[r] (rejected drafts, padding) are gone."""
        kept = kept.to(self.lengths.device)
        block_start = self.width
        new_lengths = self.lengths + kept  # [B]
        rows = torch.repeat_interleave(torch.arange(self.batch_size, device=kept.device), kept)  # [N] one per entry
        first_of_row = torch.cumsum(kept, 0) - kept  # [B] where each row's entries start in the flat list
        offsets = torch.arange(rows.shape[0], device=kept.device) - first_of_row[rows]  # [N] 0..kept[r]-1 per row
        source, target = block_start + offsets, self.lengths[rows] + offsets  # [N] columns
        for layer in self.hf_cache.layers:
            # Advanced indexing around the heads' slice gives [N, heads, head_dim]; the right side is gathered (a
            # copy) before anything is written, so a target column that is also a source is read first.
            layer.keys[rows, :, target] = layer.keys[rows, :, source]
            layer.values[rows, :, target] = layer.values[rows, :, source]
        self.lengths = new_lengths
        self._crop(int(new_lengths.max()) if self.batch_size else 0)

    def rollback(self, lengths: torch.Tensor) -> None:
        """Cut each row back to its first lengths[r] committed entries ([B] long, none longer than now) and crop to
        the widest row."""
        lengths = lengths.to(self.lengths.device)
        if bool((lengths > self.lengths).any()):
            raise ValueError(f"cannot roll rows of {self.lengths.tolist()} entries forward to {lengths.tolist()}")
        self.lengths = lengths
        self._crop(int(lengths.max()) if self.batch_size else 0)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows ([R] long indices, in the order given), cropped to the widest of them."""
        rows = rows.to(self.lengths.device)
        for layer in self.hf_cache.layers:
            layer.batch_select_indices(rows)
        self.lengths = self.lengths[rows]
        if self.batch_size:
            self._crop(int(self.lengths.max()))

    def join(self, other: "RaggedCache") -> None:
        """Append `other`'s rows after these (rows joining a running batch: their prompts prefilled in `other`, or
        empty rows with nothing committed), each keeping its committed entries; columns past a row's length are zeros
        its queries never see. The layers then hold new tensors (an append-in-place layer reallocates at its next
        block)."""
        for mine, theirs in zip(self.hf_cache.layers, other.hf_cache.layers):
            held = [layer for layer in (mine, theirs) if layer.is_initialized and layer.keys is not None
                    and layer.keys.numel()]
            if not held:
                continue  # (no entries on either side yet: the next forward starts the layer for every row)
            width = max(layer.keys.shape[-2] for layer in held)
            like = held[0].keys

            def rows_of(layer, count: int, attribute: str) -> torch.Tensor:
                if layer in held:
                    tensor = getattr(layer, attribute)
                    return torch.nn.functional.pad(tensor, (0, 0, 0, width - tensor.shape[-2]))
                return like.new_zeros((count, like.shape[1], width, like.shape[-1]))
            keys = torch.cat([rows_of(mine, self.batch_size, "keys"), rows_of(theirs, other.batch_size, "keys")])
            values = torch.cat([rows_of(mine, self.batch_size, "values"),
                                rows_of(theirs, other.batch_size, "values")])
            if not mine.is_initialized:
                mine.lazy_initialization(keys, values)
            mine.keys, mine.values = keys, values
        self.lengths = torch.cat([self.lengths, other.lengths.to(self.lengths.device)])
        self._crop(int(self.lengths.max()) if self.batch_size else 0)

    def nbytes(self) -> int:
        """Bytes of storage the cache's tensors hold (what commit must keep bounded)."""
        total = 0
        for layer in self.hf_cache.layers:
            if layer.is_initialized and layer.keys is not None:
                total += layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()
        return total

    def _crop(self, width: int) -> None:
        for layer in self.hf_cache.layers:
            # crop(-n) removes the last n columns (slicing: a view, nothing copied); crop(0) does nothing
            layer.crop(-(layer.get_seq_length() - width))
        self.width = width
