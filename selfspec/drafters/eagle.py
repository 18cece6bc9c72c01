"""EAGLE-style drafting: a small head runs autoregressively on the base's own features (`heads/eagle.py`).

Each proposal first feeds the head every position committed since its last proposal, with the base's REAL final
hidden states (`DraftContext.hidden_states`), then drafts k tokens one at a time on its own predicted features.
The head keeps its own KV cache, rolled back by length like the main one: entries written while drafting are cut
before the next proposal, which rewrites those positions from real features. It holds one entry per position read,
at that position (rotary embeddings take positions, the causal mask counts entries); a probe (`DraftContext.probe`)
reads at most the `PROBE_CATCH_UP` newest states of those it has not seen, so the positions before them stay
unread: the head attends to fewer of them, which can change its guesses, never what the verifier accepts.
Greedy drafts are argmax point masses; sampled drafts carry their draft_probs (zero outside the draft vocabulary)
to the exact verifier. The head scores its states (`EagleHead.draft_logits`): through the target's LM head, or its own
("eagle3" layout); every layout runs this one path.
Trees (`DraftContext.tree_size` = N > 0), EAGLE-2 style: depth by depth, the `tree_top_k` candidates of highest
cumulative draft probability are expanded in one head forward (a 4D mask lets each attend to its own path's entries
of the head cache, at position = depth), each adding its top-k children; then all candidates are reranked and the N
most probable kept (only those above `DraftContext.min_node_probability`, when set). A node whose cumulative
probability is no more than the N-th best so far, or not above that floor, is not expanded (none of its descendants
could be kept), and a level with no node left to expand ends the drafting. Children are DISTINCT (deterministic),
also when sampling. The tree's head entries follow the real ones, so the next proposal's crop to the real length
removes them all.
"""
from __future__ import annotations

import torch

from selfspec.attention_backends import additive_mask
from selfspec.cache import KVCache
from selfspec.drafters.base import (
    Draft, DraftContext, check_count, check_probability, draw_draft, load_extra_module, projection_weights,
    top_draft_tokens, weight_share,
)
from selfspec.tree.select import ROOT, TreeCandidates, frontier, score_floor
from selfspec.sampling import top_probability

# The most unseen states a probe reads (the newest). After steps at k = 0 a probe had the head read every position
# since its last proposal, the prompt included when it is the first: on the reference model a random head's three
# probes a call read ~160 positions, 2.3 % of the call.
PROBE_CATCH_UP = 16


def resolve_draft_vocab(draft_vocab: str, device) -> str:
    """The `draft_vocab` option -> "head" or "full": "auto" is the head's own on a CPU (where projecting onto the whole
    vocabulary costs more than it gains), the whole vocabulary on an accelerator (a few rows' projection)."""
    if draft_vocab not in ("head", "full", "auto"):
        raise ValueError("draft_vocab: 'head' (the head's draft vocabulary), 'full' (the model's whole vocabulary) "
                         f"or 'auto' ('head' on a CPU, 'full' elsewhere), got {draft_vocab!r}")
    if draft_vocab == "auto":
        return "head" if torch.device(device).type == "cpu" else "full"
    return draft_vocab


def auto_top_k(tree_size: int) -> int:
    """tree_top_k="auto": 4 up to 16 nodes, then a quarter of the node budget, at most 20 (47 -> 12, 128 -> 20).

    A CPU's trees of 10: SmolLM2 on an AMD EPYC with AVX-512, top-k 3 / 4 / 6 / 8 gave 1.87x / 2.07x / 1.92x / 1.88x of
    generate at 2.46 / 2.45 / 2.53 / 2.52 tokens per forward:
    wider costs more drafting than it gains. Larger trees, by tokens per forward (greedy, SmolLM2's head over
    the whole vocabulary, held-out prompts 6..15): 47 nodes 8 deep (a GPU's "auto") at top-k 4 / 6 / 8 / 12 / 16: 2.67 / 2.83 / 2.84 / 2.86 / 2.86;
    128 nodes 12 deep at 12 / 20: 3.17 / 3.25; sampled (T=0.7, top-p 0.9, 12 runs), 47 nodes at
    4 / 12: 2.20 / 2.45. A top-k of 4 leaves a large tree too narrow near the root (47 nodes: the first draft matched
    in 0.69 of the steps against 0.81 at 12). The wider levels cost a few more rows per head forward, nearly nothing
    where such trees are verified (an accelerator; not timed there)."""
    return 4 if tree_size <= 16 else min(20, round(tree_size / 4))


class EagleDrafter:
    """head: an `EagleHead` or its directory. min_draft_confidence: stop drafting when the draft distribution's top
    probability falls below this (0 = never); in a tree, a node whose distribution is that unsure gets no children.
    tree_top_k: in a tree, nodes expanded per depth and children per expanded node; "auto" (default): `auto_top_k`
    of the tree's node budget (4 for a CPU's trees of 10, N / 4 up to 20 for larger ones).
    draft_vocab: which LM head rows project the head's features: "head" (its draft vocabulary, if it has one),
    "full" (the model's whole vocabulary) or "auto" (default: "head" on a CPU, "full" elsewhere). The head predicts
    features, not logits, so either works with any head; the whole vocabulary drafts what a small draft vocabulary
    misses (SmolLM2's 8192 tokens cover ~92-96 % of the next tokens of held-out replies) at ~6x the projection's
    cost. SmolLM2, greedy, held-out prompts 6..15: trees of 96 nodes 10 deep 3.11 tokens per forward
    against 2.96, trees of 10 (a CPU's) 2.32 against 2.28; trees of 47 (a GPU's "auto") 8 deep: 2.84
    against 2.72 at top-k 8, 2.67 against 2.61 at top-k 4. On a CPU the projection
    costs more than it gains, so "auto" keeps the head's; on an accelerator a few rows' projection is nearly free
    (chosen from tokens per forward; wall time not measured on a GPU)."""

    # tree_size="auto" (the default) drafts trees with it where trees pay: measured on SmolLM2's EAGLE head, 1.76-1.89x
    # of generate as trees of 10 against 1.46-1.60x as chains on a CPU with the few-row kernel, and
    # 2.16x against 1.22x as trees of 47 on an H200
    auto_trees = True

    def __init__(self, target, head, min_draft_confidence: float = 0.0, tree_top_k: int | str = "auto",
                 draft_vocab: str = "auto"):
        from heads.eagle import EagleHead

        if head is None:
            raise ValueError("drafter='eagle' needs heads=EagleHead or its directory; train one with "
                             "`python -m training.heads --kind eagle`")
        head = load_extra_module(head, target.model, EagleHead, "the EAGLE head")
        check_probability("min_draft_confidence", min_draft_confidence)
        if tree_top_k != "auto":
            check_count('tree_top_k ("auto" or a count)', tree_top_k)
        resolved = resolve_draft_vocab(draft_vocab, target.device)
        if head.own_lm_head:  # an "eagle3" head's own LM head holds its draft vocabulary's rows only
            if draft_vocab == "full" and head.draft_vocab is not None:
                raise ValueError(f"this EAGLE head ('eagle3' layout) scores its {len(head.draft_vocab)} draft tokens "
                                 "with its own LM head and cannot draft over the whole vocabulary: pass "
                                 "draft_vocab='head' or 'auto'")
            resolved = "head"
        self.tree_top_k = tree_top_k
        self.head = head.eval()
        self.min_draft_confidence = min_draft_confidence
        self.embed = target.model.get_input_embeddings()
        self.draft_vocab = head.draft_vocab if resolved == "head" else None  # [N] ids or None (full vocabulary)
        self._cache = None
        self._real_length = 0  # positions read: the next proposal's first new state is at this position
        self._real_entries = 0  # head cache entries computed from the base's real features (<= _real_length)
        # A draft token meets the head and the LM head rows it projects onto (SmolLM2's head: about 0.07 of a decode);
        # an "eagle3" head's own LM head is among its parameters.
        rows = 0 if head.own_lm_head else projection_weights(target.model, self.draft_vocab)
        self.draft_cost = weight_share(target.model, [self.head], extra_weights=rows)

    @property
    def extra_modules(self) -> tuple:
        return (self.head,)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The base's hidden_states indices the head reads beside its final state (an EAGLE-3 head; () for others):
        the engine has the target return them with every hidden state (`TargetModel.set_feature_layers`)."""
        return self.head.config.feature_layers

    @property
    def projected_vocab(self) -> torch.Tensor | None:
        """The draft vocabulary the head's features are projected onto through the target's LM head (None: all of it,
        or none of it for an "eagle3" head, which scores with its own)."""
        return None if self.head.own_lm_head else self.draft_vocab

    def propose(self, context: DraftContext) -> Draft:
        # [num_new, hidden] real features of the newly committed positions ([num_new, (1 + n) hidden] with feature
        # layers: the head fuses those rows; the features it predicts below are [.., hidden] and fed back as they are)
        new_features = context.hidden_states
        num_tokens, num_new = context.token_ids.shape[0], new_features.shape[0]
        first = num_tokens - 1 - num_new  # position of new_features[0]; it predicts token_ids[first + 1]
        if first == 0 or self._cache is None:  # a new sequence
            self._cache, self._real_length, self._real_entries = KVCache(self.head, self.head.new_cache()), 0, 0
        if first != self._real_length:
            raise RuntimeError(
                f"the EAGLE drafter saw positions up to {self._real_length} but the next new feature is at {first}: "
                "every committed position's hidden state must reach it (DraftContext.hidden_states)"
            )
        self._cache.rollback(self._real_entries)  # drop the entries the previous proposal drafted on predicted features
        skip = max(num_new - PROBE_CATCH_UP, 0) if context.probe else 0  # unseen positions left unread
        positions = torch.arange(first + skip, num_tokens - 1, device=new_features.device)
        next_embeddings = self.embed(context.token_ids[first + skip + 1 :])[None]
        features = self.head(new_features[None, skip:], next_embeddings, positions[None], self._cache.hf_cache)
        self._real_length, self._real_entries = num_tokens - 1, self._cache.length
        feature = features[0, -1:]  # [1, hidden] predicted feature of the pending token's position
        if context.tree_size:
            return self._draft_tree(feature, context)
        tokens, draft_probs = [], []
        for step in range(context.num_draft_tokens):
            logits = self.head.draft_logits(feature, context.target, self.draft_vocab)  # [1, N]
            token, probs = draw_draft(logits, context, self.draft_vocab, step)  # [1] model ids, [1, vocab] or None
            # Drawn before the confidence check, which only decides how many drafts are proposed, never which.
            if self.min_draft_confidence and float(top_probability(logits, probs)) < self.min_draft_confidence:
                break
            tokens.append(token)
            if probs is not None:
                draft_probs.append(probs)
            if step + 1 < context.num_draft_tokens:
                position = torch.full((1, 1), num_tokens - 1 + step, device=token.device)
                feature = self.head(feature[None], self.embed(token)[None], position, self._cache.hf_cache)[0]
        if not tokens:
            return Draft.empty(context.token_ids.device)
        return Draft(torch.cat(tokens), torch.cat(draft_probs) if draft_probs else None)

    def top_k(self, tree_size: int) -> int:
        """Nodes expanded per level and children per expanded node in a tree of `tree_size` nodes."""
        return auto_top_k(tree_size) if self.tree_top_k == "auto" else self.tree_top_k

    def max_tree_nodes(self, depth: int, tree_size: int) -> int:
        """The most nodes a tree of at most `depth` levels holds: k children of the root, then k children of each of
        the k nodes expanded per level, the best N of them."""
        k = self.top_k(tree_size)
        return min(tree_size, k + max(depth - 1, 0) * k ** 2) if depth > 0 else 0

    def _draft_tree(self, feature: torch.Tensor, context: DraftContext) -> Draft:
        """feature [1, hidden] of the pending token's position -> the tree of the `context.tree_size` most probable
        nodes, at most `context.num_draft_tokens` deep."""
        width, device = self.top_k(context.tree_size), feature.device
        least = score_floor(context.min_node_probability)  # a kept node scores above this
        pending_position = context.token_ids.shape[0] - 1
        candidates = TreeCandidates(device)
        # Rows of `features` are the nodes expanded last (at first the root): ancestor_slots[row] holds the head cache
        # slots of that node's path (the root's are the real entries, which every row attends to anyway). ids and
        # scores are the current depth's candidates, k children per row.
        ids = torch.full((1,), ROOT, dtype=torch.long, device=device)
        scores = torch.zeros(1, device=device)
        features, ancestor_slots = feature, [[]]  # [F, hidden]
        for depth in range(context.num_draft_tokens):
            logits = self.head.draft_logits(features, context.target, self.draft_vocab)  # [F, N]
            tokens, log_probs = top_draft_tokens(logits, context, width, self.draft_vocab, depth)  # [F, k]
            if self.min_draft_confidence:  # an unsure distribution gets no children
                log_probs = log_probs.masked_fill(log_probs[:, :1].exp() < self.min_draft_confidence, -torch.inf)
            ids, scores = candidates.add_children(ids, scores, tokens, log_probs)  # [F * k]
            if depth + 1 == context.num_draft_tokens:
                break
            # [F'] the best of this depth by cumulative probability, of those whose descendants could still be among
            # the N best (when none can, deeper levels are not drafted: the same tree for fewer head forwards)
            expand = frontier(ids, scores, width, max(candidates.kth_best_score(context.tree_size), least))
            if expand.numel() == 0:
                break
            parent_rows = (expand // tokens.shape[1]).tolist()
            slots_before = self._cache.length
            mask = self._tree_mask([ancestor_slots[row] for row in parent_rows], slots_before, features.dtype, device)
            positions = torch.full((1, expand.shape[0]), pending_position + depth, device=device)
            features = self.head(features[expand // tokens.shape[1]][None], self.embed(tokens.flatten()[expand])[None],
                                 positions, self._cache.hf_cache, attention_mask=mask)[0]  # [F', hidden]
            ancestor_slots = [ancestor_slots[row] + [slots_before + i] for i, row in enumerate(parent_rows)]
            ids, scores = ids[expand], scores[expand]
        tree_tokens, parents = candidates.best(context.tree_size, least)
        return Draft(tree_tokens, parents=parents) if tree_tokens.numel() else Draft.empty(device)

    def _tree_mask(self, ancestor_slots: list[list[int]], slots_before: int, dtype, device) -> torch.Tensor:
        """[1, 1, F, slots_before + F] additive mask of one depth's forward: row i attends to the real entries, its
        ancestors' entries and its own new one."""
        rows = len(ancestor_slots)
        attended = torch.zeros(rows, slots_before + rows, dtype=torch.bool)
        attended[:, : self._real_entries] = True
        for i, slots in enumerate(ancestor_slots):
            attended[i, slots + [slots_before + i]] = True
        return additive_mask(attended, dtype)[None, None].to(device)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass

