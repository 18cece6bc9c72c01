"""Per-kind training recipes: how each head kind is built, what it is compared with, and how it is evaluated.

One interface (`Recipe`), three kinds: medusa, eagle, exit-adapter. Every loss is self-distillation: soft cross-entropy
against the frozen base's own distribution, restricted to the draft vocabulary when there is one. All offsets live
here. With h_t the base's post-norm hidden state at position t (it predicts token t+1):
- Medusa head k (0-based) reads h_t and guesses token t+2+k: the base's distribution from h_{t+1+k};
- the EAGLE head reads (h_t, token t+1) and predicts the feature h_{t+1} (regression) and, through the LM head, the
  base's distribution from h_{t+1} (an EAGLE-3 head, with feature layers, reads several of the base's layers at t and
  learns the distribution only, as EAGLE-3 drops the feature regression; in the "eagle3" layout through its own LM
  head, trained with it); passes 2.. feed it its own predicted features instead of h_t and let it attend
  to real entries up to the chain's start and the chain's own after it (as at inference, where every draft after the
  first reads a predicted feature), so later draft positions are trained as they run;
- an exit adapter reads the first L layers' output at t and guesses token t+1 like the full model.
Knows the head modules and `TargetModel`; nothing about files, optimizers or devices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from selfspec.attention_backends import additive_mask
from training.features import Batch


class Teacher:
    """The frozen base's LM head, over the draft vocabulary when there is one (as the drafters project)."""

    def __init__(self, target, draft_vocab: torch.Tensor | None):
        self.target = target
        self.draft_vocab = None if draft_vocab is None else draft_vocab.to(target.device)
        self.embed = target.model.get_input_embeddings()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., N] logits over the draft vocabulary (gradients flow to `hidden`, not the LM head)."""
        return self.target.logits(hidden, vocab_ids=self.draft_vocab)

    @torch.no_grad()
    def probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(hidden).float(), dim=-1)

    @torch.no_grad()
    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [...] the base's own greedy token over the FULL vocabulary (what greedy decoding accepts)."""
        return self.target.logits(hidden).argmax(-1)

    def to_full_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.draft_vocab is None else self.draft_vocab[draft_ids]


def eagle_logits(head, predicted: torch.Tensor, teacher: Teacher) -> torch.Tensor:
    """[..., H] states an EAGLE head predicted -> [..., N] its draft logits over the teacher's draft vocabulary, as the
    drafter scores them (`EagleHead.draft_logits`: the base's LM head, or an "eagle3" head's own, which trains)."""
    return getattr(head, "module", head).draft_logits(predicted, teacher.target, teacher.draft_vocab)


def soft_cross_entropy(student_logits: torch.Tensor, target_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over positions of -sum_v target_probs_v log_softmax(student)_v, written as
    logsumexp(student) - <target_probs, student> (no log_softmax over the vocabulary is materialised)."""
    student = student_logits.float()
    per_position = torch.logsumexp(student, dim=-1) - torch.linalg.vecdot(target_probs, student)
    return (per_position * mask).sum() / mask.sum().clamp_min(1)


def agreement(student_logits: torch.Tensor, wanted: torch.Tensor, mask: torch.Tensor) -> float:
    matches = (student_logits.detach().argmax(-1) == wanted) & mask
    return float(matches.sum() / mask.sum().clamp_min(1))


class Recipe(Protocol):
    kind: str

    def new_head(self, model, settings, draft_vocab: torch.Tensor | None) -> torch.nn.Module: ...

    def load_head(self, directory, model) -> torch.nn.Module: ...

    def loss(self, head, batch: Batch, teacher: Teacher) -> tuple[torch.Tensor, list[float]]:
        """(loss, top-1 agreement per draft position over the draft vocabulary) for one batch."""
        ...

    def evaluate(self, head, batches: list[Batch], teacher: Teacher) -> dict: ...


def _chain_summary(matches: list[torch.Tensor], masks: list[torch.Tensor]) -> dict:
    """matches[j] / masks[j]: [B, n] whether draft j+1 was right at position t + j of a chain started at t (EAGLE's
    pass j reads position t + j). Returns per draft position top-1 and the mean accepted length of a greedy chain:
    1 + sum_j P(drafts 1..j+1 all right)."""
    started = masks[0].sum().clamp_min(1)
    top1 = [float((m & k).sum() / k.sum().clamp_min(1)) for m, k in zip(matches, masks)]
    reach = matches[0] & masks[0]  # [B, n] indexed by the chain's start t
    chain = [float(reach.sum() / started)]
    for j in range(1, len(matches)):
        reach = reach[:, :-1] & (matches[j] & masks[j])[:, j:]
        chain.append(float(reach.sum() / started))
    return {"top1": [round(v, 4) for v in top1], "chain_acceptance": [round(v, 4) for v in chain],
            "mean_accepted_length": round(1 + sum(chain), 4), "positions": int(masks[0].sum())}


@dataclass(frozen=True)
class MedusaRecipe:
    num_heads: int = 4
    num_layers: int = 1
    share_lm_head: bool = True
    head_loss_decay: float = 0.8  # head k's loss weighs 0.8^k, as in Medusa: far heads matter less
    kind: str = "medusa"

    def new_head(self, model, settings, draft_vocab):
        from heads import MedusaHeads

        return MedusaHeads.for_model(model, self.num_heads, self.num_layers, self.share_lm_head, draft_vocab=draft_vocab)

    def load_head(self, directory, model):
        from heads import MedusaHeads

        return MedusaHeads.from_pretrained(directory, model=model)

    def _head_logits(self, head, batch: Batch, teacher: Teacher):
        """(k, n) -> head k's logits at positions 0..n-1; the heads run once per batch either way."""
        if getattr(head, "module", head).config.share_lm_head:
            states = head(batch.features, lambda x: x)  # [B, L, K, H]: project only where a target exists
            return lambda k, n: teacher.logits(states[:, :n, k])
        logits = head(batch.features, teacher.logits)  # [B, L, K, vocab]: own full-vocabulary LM heads
        if teacher.draft_vocab is not None:
            logits = logits[..., teacher.draft_vocab]  # [B, L, K, N]: the draft vocabulary, as the drafter reads
        return lambda k, n: logits[:, :n, k]

    def _targets(self, batch: Batch, k: int):
        n = batch.features.shape[1] - 1 - k  # positions t whose target h_{t+1+k} is inside the window
        mask = batch.same_record(1 + k)[:, :n] & batch.trained[:, 1 + k : 1 + k + n]
        return n, batch.features[:, 1 + k : 1 + k + n], mask

    def loss(self, head, batch, teacher):
        logits_of = self._head_logits(head, batch, teacher)
        loss, top1 = batch.features.new_zeros((), dtype=torch.float32), []
        for k in range(self.num_heads):
            n, target_hidden, mask = self._targets(batch, k)
            target_probs = teacher.probs(target_hidden)
            student = logits_of(k, n)
            loss = loss + self.head_loss_decay**k * soft_cross_entropy(student, target_probs, mask)
            top1.append(agreement(student, target_probs.argmax(-1), mask))
        return loss, top1

    @torch.no_grad()
    def evaluate(self, head, batches, teacher):
        matches, masks = [[] for _ in range(self.num_heads)], [[] for _ in range(self.num_heads)]
        n_min = batches[0].features.shape[1] - self.num_heads
        for batch in batches:
            logits_of = self._head_logits(head, batch, teacher)
            for k in range(self.num_heads):
                n, target_hidden, mask = self._targets(batch, k)
                guess = teacher.to_full_ids(logits_of(k, n).argmax(-1))
                matches[k].append((guess == teacher.greedy(target_hidden))[:, :n_min])
                masks[k].append(mask[:, :n_min])
        # head k at position t drafts position k of a chain started at t: align by t, not by the next position
        m = [torch.cat(x) for x in matches]
        k_ = [torch.cat(x) for x in masks]
        summary = {"top1": [], "chain_acceptance": []}
        reach = torch.ones_like(m[0])
        for k in range(self.num_heads):
            summary["top1"].append(round(float((m[k] & k_[k]).sum() / k_[k].sum().clamp_min(1)), 4))
            reach = reach & m[k] & k_[k]
            summary["chain_acceptance"].append(round(float(reach.sum() / k_[0].sum().clamp_min(1)), 4))
        summary["mean_accepted_length"] = round(1 + sum(summary["chain_acceptance"]), 4)
        summary["positions"] = int(k_[0].sum())
        return summary


def chain_mask(length: int, depth: int, dtype, device) -> torch.Tensor:
    """[1, 1, L, (depth + 1) * L] additive mask of EAGLE training pass `depth` over a head cache holding passes
    0..depth's entries (L each, in pass order): row t attends to pass 0's entries at positions <= t - depth and to
    pass i's entry at t - depth + i (i = 1..depth; its own at i = depth), the keys the drafter's draft depth+1 reads."""
    rows = torch.arange(length, device=device)[:, None]
    columns = torch.arange(length, device=device)[None]
    blocks = [columns <= rows - depth] + [columns == rows - depth + i for i in range(1, depth + 1)]
    return additive_mask(torch.cat(blocks, dim=1), dtype)[None, None]


@dataclass(frozen=True)
class EagleRecipe:
    num_layers: int = 1
    passes: int = 3  # pass j >= 2 reads the features pass j-1 predicted (training-time test, as EAGLE-3 / HASS)
    pass_decay: float = 0.8
    feature_weight: float = 0.5  # smooth-L1 on features / their RMS, beside the distribution loss (weight 1)
    kind: str = "eagle"
    layout: str = "selfspec"  # heads/eagle.py: "eagle1" and "eagle3" (the speculators format) are what vLLM serves
    # the base's hidden_states the head reads beside the final state (EAGLE-3), ascending as vLLM concatenates them
    feature_layers: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(sorted(self.feature_layers)))  # as EagleConfig stores them

    def new_head(self, model, settings, draft_vocab):
        from heads.eagle import EagleHead

        return EagleHead.for_model(model, self.num_layers, draft_vocab=draft_vocab, layout=self.layout,
                                   feature_layers=self.feature_layers)

    def load_head(self, directory, model):
        """The head in `directory`; a final-state head loaded for a recipe with feature layers is widened to them
        (`EagleHead.widened`: it drafts as before until trained), so --init warm-starts an EAGLE-3 head."""
        from heads.eagle import EagleHead

        head = EagleHead.from_pretrained(directory, model=model)
        if (self.layout == "eagle3") != (head.config.layout == "eagle3"):
            raise ValueError(f"the EAGLE head in {str(directory)!r} has the {head.config.layout!r} layout, this run "
                             f"trains {self.layout!r}: an 'eagle3' head starts fresh or from another 'eagle3' head")
        if self.feature_layers and not head.config.feature_layers:
            return EagleHead.widened(head, self.feature_layers, model)
        if head.config.feature_layers != self.feature_layers:
            raise ValueError(f"the EAGLE head in {str(directory)!r} reads feature layers {head.config.feature_layers}, "
                             f"this run {self.feature_layers}: pass --feature-layers "
                             f"{' '.join(map(str, head.config.feature_layers)) or '(none)'} or start a fresh head")
        return head

    def _passes(self, head, batch: Batch, teacher: Teacher):
        """Yields (pass index j, predicted features [B, L-1, H] for positions 1..L-1, mask [B, L-1]).

        Pass j (0-based) at row t is draft j+1 of a chain whose last real feature is h_{t-j}, computed as the drafter
        computes it (training-time test, as EAGLE-3 / HASS): it reads pass j-1's prediction for position t, and
        attends to the real entries (pass 0's) at positions <= t-j and to its chain's own entries, pass i's at t-j+i
        for i = 1..j, kept in one head cache across the passes (`chain_mask`). A row whose chain would start before
        the window, or cross into another record, is masked out."""
        B, L, _ = batch.features.shape
        with torch.no_grad():
            next_embeddings = teacher.embed(batch.next_ids).to(batch.features.dtype)
        positions = torch.arange(L, device=batch.features.device)[None].expand(B, L)
        cache = head.new_cache()
        features, trained = batch.features, batch.trained[:, 1:]
        for j in range(self.passes):
            mask = chain_mask(L, j, batch.features.dtype, batch.features.device).expand(B, -1, -1, -1)
            predicted = head(features, next_embeddings, positions, cache, attention_mask=mask)  # [B, L, H]
            chained = torch.cat([torch.zeros_like(trained[:, :j]), batch.same_record(j + 1)], dim=1)  # rows t-j..t+1
            yield j, predicted[:, :-1], chained & trained
            # position 0 of a later pass is never trained or read by a trained row; multi-layer real rows are wider
            # than predicted ones, so it then repeats a predicted row
            first = batch.features[:, :1] if batch.features.shape[-1] == predicted.shape[-1] else predicted[:, :1]
            features = torch.cat([first, predicted[:, :-1]], dim=1)

    def loss(self, head, batch, teacher):
        hidden = teacher.target.hidden_size
        target_hidden = batch.features[:, 1:, :hidden]  # the final state (multi-layer rows carry more after it)
        target_probs = teacher.probs(target_hidden)
        scale = target_hidden.float().pow(2).mean().sqrt().clamp_min(1e-6)
        feature_weight = 0.0 if self.feature_layers else self.feature_weight  # EAGLE-3 learns the distribution only
        loss, top1 = batch.features.new_zeros((), dtype=torch.float32), []
        for j, predicted, mask in self._passes(head, batch, teacher):
            student = eagle_logits(head, predicted, teacher)
            loss = loss + self.pass_decay**j * soft_cross_entropy(student, target_probs, mask)
            if feature_weight:
                regression = F.smooth_l1_loss(predicted.float() / scale, target_hidden.float() / scale,
                                              reduction="none").mean(-1)
                regression = (regression * mask).sum() / mask.sum().clamp_min(1)
                loss = loss + self.pass_decay**j * feature_weight * regression
            top1.append(agreement(student, target_probs.argmax(-1), mask))
        return loss, top1

    @torch.no_grad()
    def evaluate(self, head, batches, teacher):
        matches, masks = [[] for _ in range(self.passes)], [[] for _ in range(self.passes)]
        for batch in batches:
            wanted = teacher.greedy(batch.features[:, 1:])
            for j, predicted, mask in self._passes(head, batch, teacher):
                matches[j].append(teacher.to_full_ids(eagle_logits(head, predicted, teacher).argmax(-1)) == wanted)
                masks[j].append(mask)
        # draft j+1 of a chain started at t reads pass j's output at position t + j: shift by one per pass
        return _chain_summary([torch.cat(m) for m in matches], [torch.cat(k) for k in masks])


@dataclass(frozen=True)
class ExitAdapterRecipe:
    exit_layer: int
    num_layers: int = 1
    kind: str = "exit-adapter"

    def new_head(self, model, settings, draft_vocab):
        from heads import ExitAdapter

        return ExitAdapter.for_model(model, self.exit_layer, self.num_layers)

    def load_head(self, directory, model):
        from heads import ExitAdapter

        return ExitAdapter.from_pretrained(directory, model=model)

    def loss(self, head, batch, teacher):
        student = teacher.logits(teacher.target.final_norm(head(batch.exit_features)))
        target_probs = teacher.probs(batch.features)
        return soft_cross_entropy(student, target_probs, batch.trained), [agreement(student, target_probs.argmax(-1), batch.trained)]

    @torch.no_grad()
    def evaluate(self, head, batches, teacher):
        counts = torch.zeros(2, dtype=torch.float64)  # adapter, plain early exit
        positions = 0
        for batch in batches:
            wanted = teacher.greedy(batch.features)
            for i, state in enumerate((head(batch.exit_features), batch.exit_features)):
                guess = teacher.to_full_ids(teacher.logits(teacher.target.final_norm(state)).argmax(-1))
                counts[i] += float(((guess == wanted) & batch.trained).sum())
            positions += int(batch.trained.sum())
        return {"top1": [round(float(counts[0]) / max(positions, 1), 4)],
                "plain_early_exit_top1": round(float(counts[1]) / max(positions, 1), 4), "positions": positions}


def resolve_feature_layers(values: tuple[str, ...], num_model_layers: int) -> tuple[int, ...]:
    """--feature-layers: () -> (); ("auto",) -> EAGLE-3's low, middle and high layers; indices in ascending order
    whatever order they are given in (vLLM concatenates the auxiliary states ascending: a head trained on `27 15 2`
    would read its slots swapped there)."""
    from heads.eagle_module import check_feature_layers, default_feature_layers

    if not values:
        return ()
    auto = tuple(values) == ("auto",)
    layers = default_feature_layers(num_model_layers) if auto else tuple(sorted(int(v) for v in values))
    check_feature_layers(layers, num_model_layers, "--feature-layers")
    return layers


def recipe_for(settings, num_model_layers: int) -> Recipe:
    if settings.kind == "medusa":
        return MedusaRecipe(settings.num_heads, settings.num_layers, settings.share_lm_head, settings.head_loss_decay)
    if settings.kind == "eagle":
        return EagleRecipe(settings.num_layers, settings.eagle_passes, layout=settings.eagle_layout,
                           feature_layers=resolve_feature_layers(getattr(settings, "feature_layers", ()), num_model_layers))
    exit_layer = settings.exit_layer or num_model_layers // 2
    if not 1 <= exit_layer < num_model_layers:
        raise ValueError(f"--exit-layer must be in [1, {num_model_layers - 1}] for this model, got {exit_layer}")
    return ExitAdapterRecipe(exit_layer, settings.num_layers)
