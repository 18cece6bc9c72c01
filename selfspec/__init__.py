"""selfspec: exact self-speculative decoding for one Hugging Face causal LM.

The public names below are imported on first use, so `selfspec --help` and command-line mistakes answer at once
instead of after loading torch and transformers.
"""
from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING

_VERSION = "0.2.0"  # pyproject.toml's version, for a source tree used without installing it
try:
    __version__ = metadata.version("selfspec")  # the installed distribution's (an editable install included)
except metadata.PackageNotFoundError:
    __version__ = _VERSION

_EXPORTS = {
    "DecodeOptions": "selfspec.engine",
    "Draft": "selfspec.drafters",
    "DraftContext": "selfspec.drafters",
    "Drafter": "selfspec.drafters",
    "GenerateOutput": "selfspec.engine",
    "GenerationStats": "selfspec.stats",
    "SamplingConfig": "selfspec.sampling",
    "SelfSpecModel": "selfspec.engine",
    "StreamPiece": "selfspec.streaming",
    "TokenStream": "selfspec.streaming",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'selfspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from selfspec.drafters import Draft, DraftContext, Drafter
    from selfspec.engine import DecodeOptions, GenerateOutput, SelfSpecModel
    from selfspec.sampling import SamplingConfig
    from selfspec.stats import GenerationStats
    from selfspec.streaming import StreamPiece, TokenStream
