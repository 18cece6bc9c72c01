"""Medusa drafting: K heads read the hidden state the last verify forward already produced; no extra forward.

Greedy: each head's argmax (point masses). Sampling: each head's warped distribution, sampled; its draft_probs
go to the verifier. Head k's guess does not depend on the heads before it, which is a valid (if crude) chain.
"""
from __future__ import annotations

from selfspec.drafters.base import Draft, DraftContext
from selfspec.sampling import greedy_tokens, logits_to_probs, sample_from


class MedusaDrafter:
    def __init__(self, heads):
        self.heads = heads

    def propose(self, context: DraftContext) -> Draft:
        num_draft_tokens = min(context.num_draft_tokens, self.heads.num_heads)
        if num_draft_tokens == 0:
            return Draft.empty(context.token_ids.device)
        logits = self.heads(context.hidden_state, context.target.logits, num_draft_tokens)  # [num_draft_tokens, vocab]
        if context.sampling.greedy:
            return Draft(greedy_tokens(logits))
        draft_probs = logits_to_probs(logits, context.sampling)
        return Draft(sample_from(draft_probs, context.generator), draft_probs)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass
