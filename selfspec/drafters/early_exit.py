"""Early-exit drafting (LayerSkip-style): the model's first `exit_layer` layers, optionally an exit adapter, then its
own final norm and LM head, run one token at a time through the SHARED cache.

Shared work: drafting writes the first layers' keys and values for the pending token and every draft token, and
returns their exit-layer outputs (`Draft.prefilled_hidden`), so verification runs only the remaining layers. The
last draft token passes the first layers once more (its successor is never drafted) so its exit state exists too:
a draft of k tokens costs k + 1 partial forwards, and verification none of them again; a probe (`DraftContext.probe`:
scored in shadow against plain decoding's forward, which resumes after the pending token's drafted layers) skips the
draft token's pass: about half a probe's cost on SmolLM2 at layer 8 (0.38 -> 0.20 decodes), for state nothing reads.
Greedy drafts are argmax point masses; sampled drafts carry their draft_probs to the exact verifier. The drafter
owns its exit adapter: it loads it (or checks a given one against the model) and places it on the model.
"""
from __future__ import annotations

import torch

from selfspec.drafters.base import (
    Draft, DraftContext, check_probability, draw_draft, load_extra_module, weight_share,
)
from selfspec.sampling import top_probability


class EarlyExitDrafter:
    """exit_layer: how many layers draft (1 .. num_layers - 1); taken from the adapter when one is given.
    adapter: None (plain early exit), an `ExitAdapter`, or its directory.
    min_draft_confidence: stop drafting when the draft distribution's top probability falls below this (0 = never).
    share_work: False is the naive reference (and the benchmark's baseline): drafting's keys and values are dropped
    and verification recomputes every layer, as `transformers`' assistant_early_exit does.
    """

    def __init__(
        self, target, exit_layer: int | None = None, adapter=None, min_draft_confidence: float = 0.0,
        share_work: bool = True,
    ):
        from heads.exit_adapter import ExitAdapter

        self.adapter = load_extra_module(adapter, target.model, ExitAdapter, "the exit adapter")
        if exit_layer is None:
            if self.adapter is None:
                raise ValueError(
                    f"drafter='early_exit' needs exit_layer=L (1 .. {target.num_layers - 1}: how many of the model's "
                    "layers draft) or an exit adapter, which knows its layer"
                )
            exit_layer = self.adapter.exit_layer
        if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer < target.num_layers:
            raise ValueError(
                f"exit_layer must be an integer in 1 .. {target.num_layers - 1} for this {target.num_layers}-layer model "
                f"(drafting with all layers would be the model itself), got {exit_layer!r}"
            )
        if self.adapter is not None and self.adapter.exit_layer != exit_layer:
            raise ValueError(
                f"the exit adapter was trained at exit_layer={self.adapter.exit_layer}, not {exit_layer}: pass "
                f"exit_layer={self.adapter.exit_layer} or train an adapter for layer {exit_layer}"
            )
        check_probability("min_draft_confidence", min_draft_confidence)
        if not isinstance(share_work, bool):
            raise ValueError(f"share_work must be True or False, got {share_work!r}")
        target.parts  # fail now, not at the first draft, for a decoder that cannot run layer by layer
        self.exit_layer = exit_layer
        self.min_draft_confidence = min_draft_confidence
        self.share_work = share_work
        self.draft_cost = _draft_cost(target, exit_layer, self.adapter)

    @property
    def extra_modules(self) -> tuple:
        return () if self.adapter is None else (self.adapter,)

    def propose(self, context: DraftContext) -> Draft:
        target, cache, sampling = context.target, context.cache, context.sampling
        token = context.token_ids[-1:]  # [1] the pending token, not yet in the cache
        exit_states, tokens, draft_probs = [], [], []
        last_pass = self.share_work and not context.probe  # the last draft token's pass: its state for verification
        while last_pass or len(tokens) < context.num_draft_tokens:
            exit_state = target.exit_forward(token, cache, self.exit_layer)  # [1, hidden]; writes layers < exit_layer
            exit_states.append(exit_state)
            if len(tokens) == context.num_draft_tokens:
                break
            logits = self.exit_logits(target, exit_state)  # [1, vocab]
            # [1], and [1, vocab] warped as the target's (None when greedy). Sampled before the confidence check:
            # that check only decides how many drafts are proposed, never which, so the law stays the verifier's.
            token, probs = draw_draft(logits, context, None, len(tokens))
            if self.min_draft_confidence and float(top_probability(logits, probs)) < self.min_draft_confidence:
                break  # unsure: stop here; the last kept draft already has its exit state, no extra pass needed
            tokens.append(token)
            if probs is not None:
                draft_probs.append(probs)
        tokens = torch.cat(tokens) if tokens else context.token_ids.new_empty(0)
        draft_probs = torch.cat(draft_probs) if draft_probs else None  # [num_draft_tokens, vocab] when sampling
        if not self.share_work:  # the naive reference: forget the drafted layers' work, verification redoes it
            cache.rollback(context.token_ids.shape[0] - 1)
            return Draft(tokens, draft_probs)
        return Draft(
            tokens=tokens,
            probs=draft_probs,
            prefilled_layers=self.exit_layer,
            # [num_draft_tokens + 1, hidden]: pending, then each draft (a probe: pending only)
            prefilled_hidden=torch.cat(exit_states),
        )

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass

    def exit_logits(self, target, exit_state: torch.Tensor) -> torch.Tensor:
        """[..., hidden] exit states -> [..., vocab] draft logits: the adapter (if any), the final norm, the LM head."""
        adapted = exit_state if self.adapter is None else self.adapter(exit_state)
        return target.logits(target.final_norm(adapted))


def _draft_cost(target, exit_layer: int, adapter) -> float:
    """A draft token meets the first `exit_layer` layers, the adapter and the LM head (`weight_share`). SmolLM2-135M
    at layer 8 of 30: about 0.4 (its LM head weighs as 8 layers)."""
    modules = [*target.parts.layers[:exit_layer], target.lm_head] + ([] if adapter is None else [adapter])
    return weight_share(target.model, modules)
