"""Proof that a test took the path it names: drafts proposed, some accepted, some rejected (and, where named, a
confidence stop reached), plus drafters built so that this is true on tiny random models.

A default once turned every Medusa exactness test into plain decoding without failing any of them (the heads'
confidence threshold was above a tiny model's top probability). Every exactness and law test calls
`assert_exercised`, so such a change fails loudly instead.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from heads import MedusaHeads
from selfspec.sampling import logits_to_probs
from tests.conftest import tiny_model


def totals(stats) -> tuple[int, int]:
    """(drafted, accepted) of one GenerationStats, or summed over an iterable of them."""
    if hasattr(stats, "drafted"):
        return stats.drafted, stats.accepted
    drafted = accepted = 0
    for s in stats:
        drafted, accepted = drafted + s.drafted, accepted + s.accepted
    return drafted, accepted


def assert_exercised(stats, drafted: bool = True, accepted: bool = True, rejected: bool = True, what: str = "") -> None:
    """Fail unless drafts were proposed and (when asked) some were accepted and some rejected.

    stats: `out.stats`, or an iterable of them (a law test's many generations)."""
    num_drafted, num_accepted = totals(stats)
    where = f" ({what})" if what else ""
    counts = f"drafted {num_drafted}, accepted {num_accepted}"
    if drafted:
        assert num_drafted > 0, f"no draft was proposed{where}: this was plain decoding; {counts}"
    if accepted:
        assert num_accepted > 0, f"no draft was accepted{where}: the accept path was not taken; {counts}"
    if rejected:
        assert num_accepted < num_drafted, f"no draft was rejected{where}: the rollback path was not taken; {counts}"


class RecordingDrafter:
    """Wraps a drafter object and records each step's (asked, proposed) counts and the context it was given."""

    def __init__(self, inner, keep_contexts: bool = False):
        self.inner = inner
        self.steps: list[tuple[int, int]] = []  # (num_draft_tokens asked for, tokens proposed)
        self.outcomes: list[tuple[int, int]] = []  # (drafted, accepted) as the engine reported them
        self.contexts = [] if keep_contexts else None

    def propose(self, context):
        draft = self.inner.propose(context)
        self.steps.append((context.num_draft_tokens, draft.num_draft_tokens))
        if self.contexts is not None:
            self.contexts.append(context)
        return draft

    def observe(self, num_drafted, num_accepted):
        self.outcomes.append((num_drafted, num_accepted))
        self.inner.observe(num_drafted, num_accepted)

    def stopped_mid_chain(self) -> int:
        """Steps that proposed some tokens but fewer than asked (a confidence stop after the first draft)."""
        return sum(0 < proposed < asked for asked, proposed in self.steps)

    def stopped_at_once(self) -> int:
        """Steps that were asked for drafts and proposed none (a stop before the first draft)."""
        return sum(asked > 0 and proposed == 0 for asked, proposed in self.steps)


@torch.no_grad()
def greedy_sequences(model, prompts: Iterable[torch.Tensor], num_new: int) -> list[torch.Tensor]:
    """[T + num_new] each: the model's own greedy continuation of each [1, T] prompt."""
    return [
        model.generate(
            p, max_new_tokens=num_new, do_sample=False, eos_token_id=None, pad_token_id=2,
            attention_mask=torch.ones_like(p),
        )[0]
        for p in prompts
    ]


def trained_heads(
    model, sequences: Iterable[torch.Tensor], num_heads: int = 4, steps: int = 60, lr: float = 3e-2,
    share_lm_head: bool = True, seed: int = 0,
) -> MedusaHeads:
    """Medusa heads fitted for a few dozen full-batch Adam steps to `sequences` (typically the model's own greedy
    output): head k learns token t+2+k from the final hidden state at t. Short training leaves them right often
    and wrong often, which is what exactness tests need (accepted and rejected drafts). Takes well under a second.
    """
    torch.manual_seed(seed)
    heads = MedusaHeads.for_model(model, num_heads=num_heads, share_lm_head=share_lm_head)
    lm_weight = model.get_output_embeddings().weight.detach()
    decoder = model.get_decoder()
    inputs, targets = [], []  # [n, hidden], [n, num_heads] (-100 where the sequence ends first)
    with torch.no_grad():
        for seq in sequences:
            hidden = decoder(input_ids=seq[None]).last_hidden_state[0]  # [T, hidden]
            length = seq.shape[0]
            target = torch.full((length, num_heads), -100, dtype=torch.long)
            for k in range(num_heads):
                if length > k + 2:
                    target[: length - k - 2, k] = seq[k + 2 :]
            inputs.append(hidden)
            targets.append(target)
    inputs, targets = torch.cat(inputs), torch.cat(targets)
    optimizer = torch.optim.Adam(heads.parameters(), lr=lr)
    for _ in range(steps):
        logits = heads(inputs, lambda states: states @ lm_weight.T)  # [n, num_heads, vocab]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval().requires_grad_(False)


def sharpened(model, factor: float):
    """The model with its LM head scaled by `factor`: the same greedy output, more confident distributions (a random
    tiny model's top probability is near 1/vocab). Unties a tied LM head first so the embeddings stay as they were."""
    lm_head = model.get_output_embeddings()
    with torch.no_grad():
        lm_head.weight = torch.nn.Parameter(lm_head.weight.detach().clone() * factor)
    return model


def scrambled_model(family, seed=0, noise=0.2, **kwargs):
    """A tiny model whose layers matter: random init ties embeddings and keeps layers near the identity, so several
    families would just repeat the last token (every early-exit draft trivially right, every EOS at once). noise: the
    scale of the random weights added (wider models need less to stop repeating, and more makes them never repeat)."""
    model = tiny_model(family, seed=seed, **kwargs)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.get_decoder().parameters():
            if p.dim() == 2 and p is not model.get_input_embeddings().weight:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * noise)
    return model


@torch.no_grad()
def exit_probs(target, sequence: torch.Tensor, exit_layer: int, adapter=None, sampling=None) -> torch.Tensor:
    """[T, vocab] the early-exit draft distribution (plain softmax, or warped by `sampling`) at each position of
    `sequence` [T], as the early-exit drafter computes it."""
    hidden = target.exit_forward(sequence, target.new_cache(), exit_layer)  # [T, hidden]
    if adapter is not None:
        hidden = adapter(hidden)
    logits = target.logits(target.final_norm(hidden))
    return logits.float().softmax(dim=-1) if sampling is None else logits_to_probs(logits, sampling)


def exit_confidences(target, sequence: torch.Tensor, exit_layer: int, adapter=None, sampling=None) -> torch.Tensor:
    """[T] top probability of the early-exit draft distribution: what min_draft_confidence is compared with."""
    return exit_probs(target, sequence, exit_layer, adapter, sampling).amax(dim=-1)


@torch.no_grad()
def head_confidences(heads, model, sequence: torch.Tensor) -> torch.Tensor:
    """[T, num_heads] top probability of each Medusa head's (greedy) distribution at each position of `sequence`."""
    hidden = model.get_decoder()(input_ids=sequence[None]).last_hidden_state[0]
    return heads(hidden, model.get_output_embeddings()).float().softmax(dim=-1).amax(dim=-1)
