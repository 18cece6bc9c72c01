"""After a tree verify forward: keep the accepted path's keys and values, moved into place, and cut the rest.

A function over `cache.KVCache` (whose owner may adopt it as a method). The tree forward appended one entry per
row [root, *nodes] after `committed_length`; the accepted path is the root plus the accepted nodes, in increasing
row order, so moving them down to `committed_length, committed_length + 1, ...` never overwrites an entry still to
be moved. Then the cache is rolled back to the path's end: no memory is held for rejected branches beyond the one
step's slack that rollback also leaves. Knows nothing about drafts or sampling.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from selfspec.cache import KVCache
from selfspec.cache_layer import FULL_ATTENTION_LAYERS


def keep_path(cache: KVCache, committed_length: int, path_offsets: Sequence[int] | torch.Tensor) -> None:
    """Keep rows `path_offsets` (offsets within the appended block: 0 = root, node i = i + 1) of every layer.

    Afterwards the cache holds committed_length + len(path_offsets) entries, equal to those of a plain forward over
    the committed tokens followed by the path (positions match because a node's position is past + depth).
    """
    offsets = [int(o) for o in (path_offsets.tolist() if isinstance(path_offsets, torch.Tensor) else path_offsets)]
    if any(b <= a for a, b in zip(offsets, offsets[1:])) or (offsets and offsets[0] < 0):
        raise ValueError(f"path offsets must be increasing and >= 0 (root first), got {offsets}")
    kept_length = committed_length + len(offsets)
    for layer_idx, layer in enumerate(cache.hf_cache.layers):
        if type(layer) not in FULL_ATTENTION_LAYERS:
            raise NotImplementedError(
                f"keep_path moves entries of full-attention layers only, not {type(layer).__name__}"
            )
        appended = layer.get_seq_length() - committed_length
        if offsets and offsets[-1] >= appended:
            raise ValueError(
                f"layer {layer_idx} holds {appended} tree rows after {committed_length}; path {offsets} runs past them"
            )
        if offsets == list(range(len(offsets))):
            continue  # already in place (a chain, or a path of first children): rollback alone suffices
        source = torch.tensor(offsets, device=layer.keys.device) + committed_length
        # [batch, heads, len(path), dim] gathered first (a copy), then written down in place.
        layer.keys[:, :, committed_length:kept_length] = layer.keys.index_select(2, source)
        layer.values[:, :, committed_length:kept_length] = layer.values.index_select(2, source)
    cache.rollback(kept_length)


def path_offsets(accepted_nodes: Sequence[int]) -> list[int]:
    """Rows of the root and the accepted nodes within the appended block: [0, node + 1, ...]."""
    return [0, *(int(node) + 1 for node in accepted_nodes)]
