"""The one drafter interface: every drafter gets the same context and returns draft tokens (+ draft probs).

Drafters never see the verifier or the sampling outcome beyond how many of their tokens were accepted. A drafter
owns whatever modules it adds to the model (heads, an exit adapter): it loads and places them (`load_extra_module`)
and lists them as `extra_modules` (optional; a drafter without it adds nothing), which the stats read.
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from heads.checkpoint import lm_head_shape
from heads.draft_vocab import full_vocab_probs
from selfspec.inputs import holds_integers
from selfspec.sampling import SamplingConfig, top_probability
from selfspec.seeded import PositionNoise
from selfspec.tree.draft_tree import DraftTree

if TYPE_CHECKING:
    from selfspec.cache import KVCache
    from selfspec.sampler import Sampler
    from selfspec.target import TargetModel


@dataclass(frozen=True)
class DraftContext:
    token_ids: torch.Tensor  # [num_tokens] the sequence so far; its last token is pending (not yet in the cache)
    hidden_state: torch.Tensor  # [hidden] final hidden state at the position that predicted the pending token
    # [num_new, hidden] final hidden states of every position committed since this drafter's previous proposal
    # (after prefill: every prompt position; steps with no proposal (k = 0) accumulate). Row i is the state at
    # the position that predicts token index len(token_ids) - num_new + i, so the last row equals hidden_state.
    hidden_states: torch.Tensor
    num_draft_tokens: int  # the most tokens this step may propose (a drafter may propose fewer, even none)
    # How the request's tokens are drawn (`selfspec/sampler.py`: greedy, keyed by a seed, or rejection sampling);
    # drafters draw through it with `draw_draft` / `top_draft_tokens`, giving each draft's depth.
    sampler: "Sampler"
    target: "TargetModel"  # the shared model, for drafters that run part of it (early exit)
    cache: "KVCache"  # the shared cache; holds token_ids[:-1]
    # Node budget for a tree of draft tokens (`Draft.parents`); 0 = propose a chain. Drafters that cannot build trees
    # ignore it and return chains; `num_draft_tokens` then caps the tree's depth.
    tree_size: int = 0
    # The one token asked for is a probe the engine scores in shadow if the draft prefills layers (a draft that
    # prefills layers always is, `draft_length.probe_in_shadow`): then only the pending token's prefilled state is
    # read, and a drafter may skip prefilling its draft token (early exit: that token's pass over its layers).
    probe: bool = False
    # A tree keeps only nodes whose cumulative draft probability (the product along their path) exceeds this; 0 = the
    # `tree_size` most probable nodes, whatever their probability (`tree_forward.resolve_min_node_probability`).
    min_node_probability: float = 0.0

    @property
    def sampling(self) -> SamplingConfig:
        """The sampling settings (temperature, top-k, top-p; greedy or not)."""
        return self.sampler.config

    @property
    def generator(self) -> "torch.Generator | PositionNoise | None":
        """The randomness as drafters written before `Sampler` read it: the keyed noise (a seed), else the generator."""
        return self.sampler.noise if self.sampler.noise is not None else self.sampler.generator


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # [num_draft_tokens] long
    probs: torch.Tensor | None = None  # [num_draft_tokens, vocab] draft_probs tokens were sampled from; None = point masses
    # Shared work (early exit): the first `prefilled_layers` layers already ran over [pending, *tokens] and wrote
    # the cache; `prefilled_hidden` [num_draft_tokens + 1, hidden] is their output, so verification resumes there.
    prefilled_layers: int = 0
    prefilled_hidden: torch.Tensor | None = None
    # A tree of draft tokens (`selfspec/tree/draft_tree.py`): [num_draft_tokens] long, the parent of each token (-1 = the
    # pending token; a parent comes before its children). None = a chain, verified on the chain's own fast path.
    parents: torch.Tensor | None = None
    # How each row's children were drafted (`tree.py`: root first, then one per token); () = DISTINCT when probs is
    # None (deterministic top-k or point masses), SAMPLED otherwise.
    child_kinds: tuple[str, ...] = ()

    @property
    def num_draft_tokens(self) -> int:
        return self.tokens.shape[0]

    @property
    def depth(self) -> int:
        """Draft positions one step can accept: the chain's length, or the tree's deepest level."""
        if self.parents is None or not self.num_draft_tokens:
            return self.num_draft_tokens
        return int(self.tree().depths.max())

    def tree(self) -> DraftTree:
        """The draft as a `DraftTree` (a chain when `parents` is None); checks the tree's rules."""
        if self.parents is None:
            return DraftTree.chain(self.tokens, self.probs)
        return DraftTree(self.tokens, self.parents, self.probs, self.child_kinds)

    @classmethod
    def empty(cls, device) -> "Draft":
        return cls(torch.empty(0, dtype=torch.long, device=device))


@runtime_checkable
class Drafter(Protocol):
    """What the decode loop asks of a drafter. Optional attributes it reads when present: `extra_modules` (the
    modules it adds to the model, for the stats' memory figure), `draft_cost` (what drafting one token costs, in
    one-token decodes of the target: where the "auto" draft length starts before timings teach it; default 0) and,
    for tree drafters, `max_tree_nodes(depth, tree_size)` (the most nodes a tree that deep holds: how "auto" prices
    a tree step; default: depth) and `auto_trees` (True: `tree_size="auto"`, the default, drafts trees with it where
    trees pay; default False: chains unless a size is given); for batches, `propose_rows(contexts) -> [Draft]` (one draft per row, in one call:
    Medusa runs its heads once for all rows; default: `propose` per row); `projected_vocab` (a draft vocabulary, [N]
    token ids, whose rows of the target's LM head its drafts are projected onto with `target.logits(hidden,
    vocab_ids=projected_vocab)`: the engine builds those rows once, routes their products through the few-row kernel
    and counts them in the stats' memory figure; default None); `feature_layers` (hidden_states indices of the target's
    decoder layers whose states it reads beside the final one, as an EAGLE-3 head does: the engine sets them on the
    target once (`TargetModel.set_feature_layers`), and every hidden state it hands the drafter is then
    [final state; hidden_states[l] for l in feature_layers], (1 + n) * hidden wide; default ())."""

    def propose(self, context: DraftContext) -> Draft:
        """Draft up to `context.num_draft_tokens` tokens to follow `context.token_ids` (the engine checks the draft
        before verifying it: `check_drafts`)."""
        ...

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """Learn how many of the last proposal's tokens the verifier accepted (may do nothing)."""
        ...


def check_probability(name: str, value) -> None:
    """A drafter's option that is a probability threshold (`min_draft_confidence`) must be a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def check_count(name: str, value) -> None:
    """A drafter's option that counts something (an n-gram's length, a tree's top k) must be an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_drafts(drafts: list, contexts: list[DraftContext], drafter) -> None:
    """Refuse, naming the drafter, a draft the engine cannot verify exactly: not a `Draft`; tokens not a 1-D integer
    tensor on the sequence's device; more tokens than asked (a chain: `num_draft_tokens`; a tree: `tree_size`); ids
    outside the vocabulary; draft_probs not [num_tokens, vocab] floats, or 0 at a drafted token (the verifier would
    accept it wherever the target allows it: a biased law). Runs every step: a few tensor ops per draft, one read."""
    name = type(drafter).__name__
    flagged = []  # per draft with tokens: [num_tokens] bool, True at an id outside the vocabulary or of probability 0
    for draft, context in zip(drafts, contexts):
        if not isinstance(draft, Draft):
            raise ValueError(f"{name}.propose returned {type(draft).__name__}, not a Draft: return Draft(tokens) "
                             "(or Draft.empty(device) to propose nothing)")
        tokens, vocab = draft.tokens, context.target.vocab_size
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 1 or not holds_integers(tokens):
            raise ValueError(f"{name} drafted {_described(tokens)}: Draft.tokens must be a 1-D tensor of token ids "
                             "(torch.long)")
        if tokens.device != context.token_ids.device:
            raise ValueError(f"{name} drafted tokens on {tokens.device}, the sequence is on "
                             f"{context.token_ids.device}: draft on the model's device")
        # (a tree where none was asked for, tree_size 0: the engine and the batch say so with what to do)
        asked, what = (context.num_draft_tokens, "num_draft_tokens") if draft.parents is None else (
            context.tree_size, "tree_size")
        if tokens.shape[0] > asked and (draft.parents is None or context.tree_size):
            raise ValueError(f"{name} drafted {tokens.shape[0]} tokens but was asked for at most {asked} "
                             f"(DraftContext.{what}): propose no more than that")
        probs = draft.probs
        if probs is not None and (not isinstance(probs, torch.Tensor) or not probs.is_floating_point()
                                  or tuple(probs.shape) != (tokens.shape[0], vocab) or probs.device != tokens.device):
            raise ValueError(f"{name} gave draft_probs of {_described(probs)} for {tokens.shape[0]} tokens: "
                             f"Draft.probs must be [{tokens.shape[0]}, {vocab}] floats on the tokens' device (a row "
                             "over the model's vocabulary per token) or None (point masses)")
        if tokens.numel():
            bad = (tokens < 0) | (tokens >= vocab)  # [num_tokens]
            if probs is not None:  # each token's own draft probability (a clamped id: one outside is flagged above)
                bad = bad | ~(probs.gather(1, tokens.clamp(0, vocab - 1).long()[:, None])[:, 0] > 0)
            flagged.append(bad)
    if flagged and bool((flagged[0] if len(flagged) == 1 else torch.cat(flagged)).any()):
        for draft, context in zip(drafts, contexts):
            tokens, vocab = draft.tokens.tolist(), context.target.vocab_size
            if any(not 0 <= token < vocab for token in tokens):
                raise ValueError(f"{name} drafted ids outside the model's vocabulary [0, {vocab}): {tokens[:16]}")
        raise ValueError(f"{name} drafted a token its draft_probs give probability 0 (or NaN): the verifier needs the "
                         "law each token was drawn from (Draft.probs), or None for point masses")


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def draft_positions(context: DraftContext, depth) -> int | list[int]:
    """The sequence positions of drafts `depth` levels after the pending token (0: the first draft token): an int for
    every row alike, or a sequence with one depth per row of logits (Medusa's heads: row i is depth i)."""
    first = context.token_ids.shape[0]  # the pending token is at first - 1
    return first + depth if isinstance(depth, int) else [first + int(d) for d in depth]


def draw_draft(logits: torch.Tensor, context: DraftContext, draft_vocab: torch.Tensor | None = None, depth=0):
    """[..., N] draft logits (over `draft_vocab`, or the full vocabulary when it is None) -> ([...] token ids in the
    model's vocabulary, [..., vocab] draft_probs with zeros outside the draft vocabulary, or None when greedy).
    depth: how far past the pending token the drafts are (an int, or one per row; `draft_positions`).

    Drafts are drawn by `Sampler.draw_draft`, warped as the target is; a draft vocabulary only narrows where draft mass
    may sit, and the verifier returns the target's mass elsewhere through the residual. With a seed, a draft is the
    keyed draw of its position over the draft's logits (the same noise the target's draw there uses, restricted to
    the draft vocabulary), which the keyed verifier accepts when it equals the target's; draft_probs are still the
    law it was drawn from (Gumbel-max samples it), which confidence stops read."""
    tokens, probs = context.sampler.draw_draft(logits, draft_positions(context, depth), draft_vocab)
    if draft_vocab is None:
        return tokens, probs
    tokens = draft_vocab[tokens]
    return tokens, None if probs is None else full_vocab_probs(probs, draft_vocab, context.target.vocab_size)


def draw_rows(logits: torch.Tensor, contexts: list[DraftContext], draft_vocab: torch.Tensor | None = None, depth=0):
    """A batch's drafting rows: [D, N] logits, one context per row -> ([D] tokens, [D, vocab] draft_probs or None when
    greedy), each row drawn with its own context and generator, as it draws alone. Greedy draws use no generator: one
    argmax serves all rows."""
    if all(context.sampling.greedy for context in contexts):
        return draw_draft(logits, contexts[0], draft_vocab)
    depths = [depth] * len(contexts) if isinstance(depth, int) else list(depth)  # each row's draft depth
    drawn = [draw_draft(logits[i : i + 1], context, draft_vocab, depths[i]) for i, context in enumerate(contexts)]
    sampled = next(probs for _, probs in drawn if probs is not None)
    # (a greedy row beside sampled ones: its draft is a point mass the verifier never reads; its row of draft_probs is
    # the plain softmax its confidence is read from alone, `top_probability`)
    probs = [p if p is not None else _plain_probs(logits[i : i + 1], draft_vocab, contexts[i]).to(sampled.dtype)
             for i, (_, p) in enumerate(drawn)]
    return torch.cat([token for token, _ in drawn]), torch.cat(probs)


def _plain_probs(logits: torch.Tensor, draft_vocab: torch.Tensor | None, context: DraftContext) -> torch.Tensor:
    probs = logits.float().softmax(dim=-1)
    return probs if draft_vocab is None else full_vocab_probs(probs, draft_vocab, context.target.vocab_size)


def confident_rows(logits: torch.Tensor, probs: torch.Tensor | None, min_draft_confidence: float) -> list[bool]:
    """Per drafting row: is its draft distribution sure enough to propose the token it drew? Compared as Python
    floats, as the single-sequence drafters compare them (a float32 tensor against the threshold would round the
    threshold)."""
    if not min_draft_confidence:
        return [True] * logits.shape[0]
    return [top >= min_draft_confidence for top in top_probability(logits, probs).tolist()]


def top_draft_tokens(logits: torch.Tensor, context: DraftContext, k: int, draft_vocab: torch.Tensor | None = None,
                     depth=0):
    """[..., N] draft logits -> ([..., k'] the k' = min(k, N) most probable token ids in the model's vocabulary, most
    probable first, [..., k'] their log draft probabilities): the DISTINCT children of a tree node.

    Ranked under the sampling's warpers (plain softmax when greedy), so a tree spends its nodes on tokens the target
    may emit; with a seed, by the softmax of the warped logits plus the keyed noise of the children's position
    (`depth` as in `draw_draft`), whose first child is the draft's keyed draw. Any ranking keeps verification exact,
    because DISTINCT children need no draft_probs."""
    probs = context.sampler.rank(logits, draft_positions(context, depth), draft_vocab)
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)  # [..., k'] sorted, most probable first
    tokens = top.indices if draft_vocab is None else draft_vocab[top.indices]
    return tokens, top.values.log()


def drafter_modules(drafter, target: "TargetModel | None" = None) -> list[torch.nn.Module]:
    """The modules a drafter adds to the model: its `extra_modules` (none for a drafter, such as a user's own object,
    that lists none) and, given the `target`, the copy of the LM head's rows of its `projected_vocab`
    (`TargetModel.lm_head_rows`; SmolLM2's 8192 rows: 19 MB in float32). The engine routes them through the few-row
    kernel and the stats count their bytes."""
    modules = list(getattr(drafter, "extra_modules", ()))
    vocab = getattr(drafter, "projected_vocab", None)
    if vocab is not None and target is not None:
        modules.append(target.lm_head_rows(vocab))
    return modules


def drafter_parameter_bytes(drafter, target: "TargetModel | None" = None) -> int:
    """Bytes of the parameters of `drafter_modules(drafter, target)`."""
    return sum(p.numel() * p.element_size() for module in drafter_modules(drafter, target) for p in module.parameters())


def weight_share(model, modules=(), extra_weights: int = 0) -> float:
    """What drafting one token costs, in one-token decodes of the target, as the share of the weights it meets: the
    parameters of `modules` plus `extra_weights` (e.g. the LM head rows of a draft vocabulary), over every weight a
    one-token forward of the target `model` multiplies by (all its parameters but an untied input embedding, of which
    it reads one row). A one-token forward is matrix-vector products, so its time follows the weights it reads; the
    "auto" draft length starts from this `draft_cost` and learns the real cost from timings."""
    from selfspec.kernel.quantized import weight_count  # (weights kept as GGUF blocks are buffers: counted too)

    total = weight_count(model)
    embedding = model.get_input_embeddings().weight
    if embedding is not model.get_output_embeddings().weight:
        total -= embedding.numel()
    drafted = sum(weight_count(module) for module in modules) + extra_weights
    return drafted / max(total, 1)


def projection_weights(model, draft_vocab: torch.Tensor | None) -> int:
    """The LM head weights a draft token's logits read: the rows of its draft vocabulary, else all of them."""
    vocab, hidden = lm_head_shape(model)  # (by the layer's sizes: a 4-bit weight is packed)
    return (vocab if draft_vocab is None else draft_vocab.numel()) * hidden


def load_extra_module(value, model, module_class, what: str):
    """A drafter's own module for `model`: from a directory (`module_class.from_pretrained`, which checks the base
    and places it), or a ready module, checked against `model` and moved to its device and dtype (heads follow the
    model). None stays None."""
    from heads.checkpoint import attach

    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return module_class.from_pretrained(value, model=model).eval()
    if isinstance(value, module_class):
        return attach(value, model, value.config.base, what)
    raise TypeError(f"{what} must be a {module_class.__name__} or its directory, got {type(value).__name__}")


class NoDrafter:
    """Speculation off: every step verifies the pending token alone, which is plain decoding through the engine."""

    extra_modules = ()

    def propose(self, context: DraftContext) -> Draft:
        return Draft.empty(context.token_ids.device)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass
