"""Drafters: where draft tokens come from. All share one interface (`drafters/base.py`); each owns and loads its own
extra modules (Medusa heads, an exit adapter)."""
from __future__ import annotations

import inspect
import os

from selfspec.drafters.base import Draft, DraftContext, Drafter, NoDrafter, drafter_modules, drafter_parameter_bytes
from selfspec.drafters.medusa import MedusaDrafter
from selfspec.drafters.ngram import NgramDrafter

DRAFTER_NAMES = ("medusa", "eagle", "ngram", "early_exit", "none")
HEAD_DRAFTERS = ("medusa", "eagle")


def heads_kind(heads) -> str:
    """"eagle" or "medusa": what a heads module or directory holds (a directory in any format its loaders read:
    `heads.eagle.is_eagle_directory`)."""
    from heads.eagle import EagleHead, is_eagle_directory

    if isinstance(heads, EagleHead):
        return "eagle"
    if isinstance(heads, (str, os.PathLike)):
        return "eagle" if is_eagle_directory(heads) else "medusa"
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
        if isinstance(drafter, type):  # a class passes the Protocol check (it has the methods), then fails at generate
            raise TypeError(f"drafter={drafter.__name__} is a class: pass an instance: drafter={drafter.__name__}()")
        if options:
            raise ValueError(f"drafter options {sorted(options)} only apply to a drafter given by name")
        if not isinstance(drafter, Drafter):
            raise TypeError(
                f"a drafter object needs propose(context) -> Draft and observe(num_drafted, num_accepted) "
                f"(which may do nothing); {type(drafter).__name__} lacks one"
            )
        return drafter
    check_options(drafter, options)
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


# generate()'s and stream()'s own arguments: given to the wrapper, they are a misplaced call argument, not a typo
# (kept equal to their signatures by tests/selfspec/test_errors.py; the engine imports this module, not the reverse)
CALL_ARGUMENTS = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "num_draft_tokens", "seed",
                  "generator", "eos_token_id", "stop_strings", "streamer", "attention_mask")


def drafter_options(drafter: str) -> list[str]:
    """The options a drafter given by name takes (`SelfSpecModel(..., **drafter_options)`)."""
    from selfspec.drafters.early_exit import EarlyExitDrafter
    from selfspec.drafters.eagle import EagleDrafter

    cls = {"medusa": MedusaDrafter, "eagle": EagleDrafter, "ngram": NgramDrafter, "early_exit": EarlyExitDrafter,
           "none": NoDrafter}[drafter]
    taken_by_the_wrapper = ("self", "target", "heads", "head", "model")
    return [name for name, parameter in inspect.signature(cls.__init__).parameters.items()
            if name not in taken_by_the_wrapper and parameter.kind is parameter.POSITIONAL_OR_KEYWORD]


def drafters_taking(option: str) -> list[str]:
    """The names of the drafters that take `option` (none for a typo or a generate() argument)."""
    return [name for name in DRAFTER_NAMES if option in drafter_options(name)]


def check_options(drafter: str, options: dict) -> None:
    """A clear error for an option the named drafter does not take (a typo, another drafter's option, or a
    generate() argument given to the wrapper), naming the options it does take."""
    if drafter not in DRAFTER_NAMES:
        return  # make_drafter says the name is unknown
    known = drafter_options(drafter)
    unknown = sorted(set(options) - set(known))
    if not unknown:
        return
    misplaced = [name for name in unknown if name in CALL_ARGUMENTS]
    takes = f"it takes {', '.join(known)}" if known else "it takes none"
    message = f"SelfSpecModel got {', '.join(unknown)}: not an option of drafter={drafter!r} ({takes})"
    for name in unknown:
        others = [repr(other) for other in drafters_taking(name)]
        if others:
            message += f"; {name} is an option of drafter={' / '.join(others)}"
    if misplaced:
        message += (f"; {', '.join(misplaced)} {'is an argument' if len(misplaced) == 1 else 'are arguments'} of "
                    f"generate() and stream(): spec.generate(prompt, {misplaced[0]}=...)")
    raise ValueError(message)


__all__ = [
    "Draft", "DraftContext", "Drafter", "MedusaDrafter", "NgramDrafter", "NoDrafter", "drafter_modules",
    "drafter_parameter_bytes",
    "make_drafter",
]
