"""Drafters: where draft tokens come from. All share one interface (`drafters/base.py`); each owns and loads its own
extra modules (Medusa heads, an exit adapter)."""
from __future__ import annotations

from selfspec.drafters.base import Draft, DraftContext, Drafter, NoDrafter, drafter_parameter_bytes
from selfspec.drafters.medusa import MedusaDrafter
from selfspec.drafters.ngram import NgramDrafter

DRAFTER_NAMES = ("medusa", "ngram", "early_exit", "none")


def make_drafter(drafter, target, heads=None, options: dict | None = None) -> Drafter:
    """A drafter from its name (or a ready drafter object) and its options; `heads` go to the Medusa drafter."""
    options = options or {}
    if drafter is None:
        drafter = "medusa" if heads is not None else "ngram"
    if heads is not None and drafter != "medusa":
        raise ValueError(f"heads only draft with drafter='medusa', not {drafter!r}: drop heads=... or the drafter")
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
    if drafter == "ngram":
        return NgramDrafter(**options)
    if drafter == "none":
        return NoDrafter(**options)
    if drafter == "early_exit":
        from selfspec.drafters.early_exit import EarlyExitDrafter

        return EarlyExitDrafter(target, **options)
    raise ValueError(f"unknown drafter {drafter!r}; choose one of {', '.join(DRAFTER_NAMES)} or pass a drafter object")


__all__ = [
    "Draft", "DraftContext", "Drafter", "MedusaDrafter", "NgramDrafter", "NoDrafter", "drafter_parameter_bytes",
    "make_drafter",
]
