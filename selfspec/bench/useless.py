"""The useless-drafts check (`--useless-prompts N`): cases where drafts cannot help, every drafter at its DEFAULT settings,
each run beside plain `generate` and selfspec with speculation off. Target: no row below 0.95x of either.

Cases: random drafts (a user's drafter through the public interface); random, untrained Medusa heads; a random,
untrained EAGLE head (trees by default where trees pay); the given
heads sampled at temperature 1.0 (weak heads where their drafts fit worst); early exit at a layer the model was not
trained to exit at; and a fresh SelfSpecModel for every call, as the command line builds one (wrapping and any
first-use measurement are then paid by every generation). Knows which cases exist, not how they are timed.
"""
from __future__ import annotations

from dataclasses import dataclass

from selfspec.bench.methods import (
    GREEDY, SAMPLE, SAMPLE_T1, Method, Mode, RandomDrafter, random_eagle_head, random_heads, selfspec_method,
)
from selfspec.bench.models import Loaded
from selfspec.engine import SelfSpecModel


@dataclass(frozen=True)
class Case:
    name: str
    modes: tuple[Mode, ...]
    method: Method


def useless_cases(loaded: Loaded, max_new_tokens: int, seed: int, notes: list[str], eos_token_id) -> list[Case]:
    """eos_token_id: what the cases stop at, as `generate` takes it ([]: nothing, every run decodes max_new_tokens,
    as the check runs them)."""
    model, n, eos = loaded.model, max_new_tokens, eos_token_id
    vocab = model.get_output_embeddings().weight.shape[0]
    both = (GREEDY, SAMPLE)
    cases = [Case("random drafts", both, selfspec_method(
        "selfspec random drafter (default)", lambda: SelfSpecModel(model, RandomDrafter(vocab, seed)), n, eos,
        "random"))]
    noise = random_heads(model, like=loaded.heads, seed=seed + 2)
    cases.append(Case("random (untrained) Medusa heads", both, selfspec_method(
        "selfspec medusa, random heads (default)", lambda: SelfSpecModel(model, "medusa", heads=noise), n, eos,
        "medusa", extra=noise)))
    eagle_noise = random_eagle_head(model, seed=seed + 3)
    cases.append(Case("random (untrained) EAGLE head", both, selfspec_method(
        "selfspec eagle, random head (default)", lambda: SelfSpecModel(model, heads=eagle_noise), n, eos, "eagle",
        extra=eagle_noise)))
    if loaded.heads is not None:
        cases.append(Case("weak heads at T=1", (SAMPLE_T1,), selfspec_method(
            "selfspec medusa (default)", lambda: SelfSpecModel(model, "medusa", heads=loaded.heads), n, eos,
            "medusa", extra=loaded.heads)))
    layer = loaded.untrained_exit_layer
    try:
        cases.append(Case(f"early exit at untrained layer {layer}", both, selfspec_method(
            f"selfspec early_exit L={layer} (default)",
            lambda: SelfSpecModel(model, "early_exit", exit_layer=layer), n, eos, "early_exit")))
    except (ValueError, TypeError, NotImplementedError) as err:
        notes.append(f"useless drafts: early exit at layer {layer} skipped: {err}")
    drafter = "medusa" if loaded.heads_dir is not None else "ngram"
    cases.append(Case("fresh SelfSpecModel per call", both, selfspec_method(
        f"selfspec {drafter}, built per call (default)",
        lambda: SelfSpecModel(model, heads=loaded.heads_dir, tokenizer=loaded.tokenizer), n, eos, drafter,
        fresh=True)))
    return cases
