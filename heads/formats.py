"""Other checkpoint formats for Medusa heads: published Medusa heads (read) and vLLM's Medusa layout (write)."""
from __future__ import annotations


def load_published_medusa(directory, raw_config, model):
    raise NotImplementedError(
        f"{directory!r} is not a selfspec heads directory and reading published Medusa heads is not implemented yet"
    )


def save_vllm(heads, directory):
    raise NotImplementedError("exporting heads in vLLM's Medusa format is not implemented yet")
