"""EAGLE heads in the `speculators` package's format (what vLLM loads for EAGLE and EAGLE-3 drafts)."""
from __future__ import annotations


def is_speculators_config(raw: dict) -> bool:
    """Whether a config.json was written in the `speculators` format (it names its `speculators_model_type`)."""
    return "speculators_model_type" in raw


def save_speculators(head, directory, model=None) -> None:
    raise NotImplementedError("the speculators format is not written yet")


def load_speculators(cls, directory, raw: dict, model=None, check_base: bool = True):
    raise NotImplementedError("the speculators format is not read yet")
