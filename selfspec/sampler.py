"""How one request's tokens are chosen, made once per request and asked by everything that draws or verifies: the
engine's own draws, every drafter's drafts and tree rankings, and each step's verdict. Three modes:

- greedy: `generate`'s argmax; drafts are point masses.
- keyed (a seed, or a torch.Generator that gives one seed per call): every draw at sequence position n is the argmax
  of the warped logits plus noise keyed by (seed, n) (`selfspec/seeded.py`), so the tokens are the same whatever was
  drafted; verified by equality.
- rejection (no seed): draws from a torch.Generator (None: torch's global one), consumed in order; verified by
  rejection sampling against the draft's probabilities.

Nothing else branches on the kind of randomness: code asks `sampler.mode` or calls its methods. The verdicts are the
pure functions of `verifier.py` and `tree/verifier.py`; the batched tensor forms are `verdicts.py`'s.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from selfspec.sampling import (SamplingConfig, WarpedRows, greedy_tokens, keyed_scores, keyed_tokens,
                               logits_to_probs, sample_from)
from selfspec.seeded import PositionNoise, keyed_noise
from selfspec.tree.verifier import verify_tree_greedy, verify_tree_keyed, verify_tree_sampled
from selfspec.verifier import Verdict, verify_greedy, verify_keyed, verify_sampled


@dataclass(frozen=True)
class Sampler:
    config: SamplingConfig = SamplingConfig()
    noise: PositionNoise | None = None  # keyed: the request's noise
    generator: torch.Generator | None = None  # rejection: the draws' generator (None: torch's global one)

    def __post_init__(self):
        if self.noise is not None and self.generator is not None:
            raise ValueError("a sampler draws keyed noise or from a generator, not both")

    @classmethod
    def for_request(cls, config: SamplingConfig, seed: int | None, generator: torch.Generator | None,
                    vocab_size: int, device) -> "Sampler":
        """What `generate`'s arguments mean: greedy without sampling; with a seed (or a generator, which gives one
        seed per call: drawn here, greedy or not) keyed; else rejection sampling on torch's global generator."""
        return cls(config, noise=keyed_noise(seed, generator, vocab_size, device))

    @property
    def mode(self) -> str:
        """"greedy", "keyed" or "rejection"."""
        return "greedy" if self.config.greedy else "keyed" if self.noise is not None else "rejection"

    @property
    def by_equality(self) -> bool:
        """Whether a draft is accepted exactly when it equals the target's own token (greedy, keyed): the verdict then
        needs no draft probabilities and no randomness of its own."""
        return self.mode != "rejection"

    def draw(self, logits: torch.Tensor, positions=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[..., vocab] logits -> ([...] token ids, [..., vocab] the probabilities they were drawn from, or None for
        point masses: greedy and keyed). positions: the sequence positions the tokens are for (an int, or one per
        row); keyed draws need them. The engine's tokens and, through `draw_draft`, every draft come from here, so
        draft and target are always warped alike."""
        if self.mode == "greedy":
            return greedy_tokens(logits), None
        if self.mode == "keyed":
            return keyed_tokens(logits, self.config, self.noise, positions).reshape(logits.shape[:-1]), None
        probs = logits_to_probs(logits, self.config)
        return sample_from(probs, self.generator), probs

    def draw_draft(self, logits: torch.Tensor, positions, draft_vocab: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[..., N] draft logits (over `draft_vocab`'s ids, or the whole vocabulary) -> ([...] ids into the logits'
        columns, [..., N] the draft law or None when greedy). Keyed: the keyed draw of each position over the draft's
        logits (the noise the target's draw there uses, restricted to the draft vocabulary), with the law it was drawn
        from (Gumbel-max samples it), which confidence stops read."""
        if self.mode == "keyed":
            tokens = keyed_tokens(logits, self.config, self.noise, positions, draft_vocab).reshape(logits.shape[:-1])
            return tokens, logits_to_probs(logits, self.config)
        return self.draw(logits, positions)

    def rank(self, logits: torch.Tensor, positions, draft_vocab: torch.Tensor | None = None) -> torch.Tensor:
        """[..., N] draft logits -> [..., N] scores ranking a tree node's children: the plain softmax (greedy), the
        softmax of the warped logits plus the position's keyed noise (keyed: its argmax is the keyed draw), the warped
        law (rejection). Any ranking keeps verification exact (DISTINCT children need no draft probabilities)."""
        if self.mode == "greedy":
            return logits.float().softmax(dim=-1)
        if self.mode == "keyed":
            scores = keyed_scores(logits, self.config, self.noise, positions, draft_vocab)
            return scores.reshape(logits.shape).to(torch.promote_types(logits.dtype, torch.float32))
        return logits_to_probs(logits, self.config)

    def verify_chain(self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                     first_position: int) -> Verdict:
        """A chain's verdict: target_logits [k + 1, vocab], row 0 deciding sequence position `first_position` (the
        pending token's index + 1)."""
        if self.mode == "greedy":
            return verify_greedy(draft_tokens, target_logits)
        if self.mode == "keyed":
            return verify_keyed(draft_tokens, target_logits, self.config, self.noise, first_position)
        return verify_sampled(draft_tokens, draft_probs, WarpedRows(target_logits, self.config), self.generator)

    def verify_tree(self, tree, target_logits: torch.Tensor, first_position: int):
        """A tree's verdict (`tree/verifier.py`): target_logits [num_nodes + 1, vocab], row 0 the pending token's."""
        if self.mode == "greedy":
            return verify_tree_greedy(tree, target_logits)
        if self.mode == "keyed":
            return verify_tree_keyed(tree, target_logits, self.config, self.noise, first_position)
        return verify_tree_sampled(tree, WarpedRows(target_logits, self.config), self.generator)
