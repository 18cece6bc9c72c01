"""Drafters: where draft tokens come from. All share one interface (`drafters/base.py`); each owns and loads its own
extra modules (Medusa heads, an exit adapter)."""
from __future__ import annotations

import os

from selfspec.drafters.base import Draft, DraftContext, Drafter, NoDrafter, drafter_modules, drafter_parameter_bytes
from selfspec.drafters.medusa import MedusaDrafter
from selfspec.drafters.ngram import NgramDrafter

DRAFTER_NAMES = ("medusa", "eagle", "ngram", "early_exit", "none")
HEAD_DRAFTERS = ("medusa", "eagle")


def heads_kind(heads) -> str:
    """"eagle" or "medusa": what a heads module or directory holds (a directory says so in its config.json)."""
    from heads.eagle import FORMAT_NAME as EAGLE_FORMAT
    from heads.eagle import EagleHead

    if isinstance(heads, EagleHead):
        return "eagle"
    if isinstance(heads, (str, os.PathLike)):
        from heads.checkpoint import read_config

        raw = read_config(heads, "a heads directory")
        return "eagle" if raw.get("format") == EAGLE_FORMAT or raw.get("kind") == "eagle" else "medusa"
    return "medusa"


def make_drafter(drafter, target, heads=None, options: dict | None = None) -> Drafter:
    """A drafter from its name (or a ready drafter object) and its options; `heads` go to the drafter of their
    kind (Medusa heads or an EAGLE head, chosen from the heads themselves when no drafter is named)."""
    options = options or {}
    if drafter is None:
        drafter = heads_kind(heads) if heads is not None else "ngram"
    if heads is not None and drafter not in HEAD_DRAFTERS:
        raise ValueError(f"heads draft with drafter='medusa' or 'eagle', not {drafter!r}: drop heads=... or the drafter")
    if not isinstance(drafter, str):
        if options:
            raise ValueError(f"drafter options {sorted(options)} only apply to a drafter given by name")
        if not isinstance(drafter, Drafter):
            raise TypeError(
                f"a drafter object needs propose(context) -> Draft and observe(num_drafted, num_accepted) "
                f"(which may do nothing); {type(drafter).__name__} lacks one"
            )
        return drafter
    if drafter == "medusa":
        if heads is None:
            raise ValueError(
                "drafter='medusa' needs heads=MedusaHeads or a heads directory; train them with "
                "`python -m training.heads`, or use drafter='ngram' (no parameters)"
            )
        return MedusaDrafter(heads, target.model, **options)
    if drafter == "eagle":
        from selfspec.drafters.eagle import EagleDrafter

        return EagleDrafter(target, heads, **options)
    if drafter == "ngram":
        return NgramDrafter(**options)
    if drafter == "none":
        return NoDrafter(**options)
    if drafter == "early_exit":
        from selfspec.drafters.early_exit import EarlyExitDrafter

        return EarlyExitDrafter(target, **options)
    raise ValueError(f"unknown drafter {drafter!r}; choose one of {', '.join(DRAFTER_NAMES)} or pass a drafter object")


__all__ = [
    "Draft", "DraftContext", "Drafter", "MedusaDrafter", "NgramDrafter", "NoDrafter", "drafter_modules",
    "drafter_parameter_bytes",
    "make_drafter",
]
