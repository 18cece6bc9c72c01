"""The batched EAGLE drafter equals one `EagleDrafter` per row: the same draft tokens (greedy) and the same draft_probs
(sampled, a seed per row) for rows of different lengths over steps with accepted and rejected drafts, rows asked for
no drafts, rows stopping at their own confidence and rows leaving the batch; and the batch decode loop drafts EAGLE
through it (one head forward per draft position for all rows), every row still equal to its prompt alone."""
from dataclasses import dataclass, field

import pytest
import torch

from heads.eagle import EagleHead
from selfspec import SelfSpecModel
from selfspec.drafters.base import Draft, DraftContext
from selfspec.drafters.eagle import EagleDrafter
from selfspec.drafters.eagle_batch import BatchEagleDrafter
from selfspec.sampler import Sampler
from selfspec.sampling import SamplingConfig
from selfspec.target import TargetModel
from selfspec.verify_step import verify_chain
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.exercised import assert_exercised
from tests.selfspec.batch.test_decode import row_zero_stops_early
from tests.selfspec.drafters.test_eagle import sharp, trained_head

GREEDY = SamplingConfig()
SAMPLED = SamplingConfig(do_sample=True, temperature=0.8, top_k=20)


@pytest.fixture(scope="module")
def model_and_head():
    model = sharp(tiny_model("llama"))
    return model, trained_head(model, steps=40)


def prompts_of_different_lengths():
    return [random_prompt(9, seed=1)[0], repetitive_prompt(20, seed=2)[0], random_prompt(4, seed=3)[0],
            random_prompt(13, seed=4)[0]]


@dataclass
class _Row:
    """One prompt decoded as the engine decodes it alone (its own target cache, `verify_chain`), with the states each
    drafter has not seen yet: the row's own EagleDrafter is not asked at k = 0 (its states wait), the batch always."""

    index: int
    cache: object
    token_ids: torch.Tensor  # [num_tokens] committed
    pending: int
    alone_unseen: list
    batch_unseen: list
    alone_generator: torch.Generator
    batch_generator: torch.Generator
    engine_generator: torch.Generator
    drafts: list = field(default_factory=list)  # per step: (step, k, Draft, num_accepted)


def context(token_ids, unseen, k, sampling, generator, target):
    hidden_states = torch.cat(unseen)
    return DraftContext(token_ids, hidden_states[-1], hidden_states, k, Sampler(sampling, generator=generator), target,
                        None)


@torch.no_grad()
def drive(model, head, sampling, num_steps, draft_length, leave=None, min_draft_confidence=0.0) -> list[_Row]:
    """Decode every prompt alone for num_steps steps, drafting each step with the row's own EagleDrafter and with one
    BatchEagleDrafter for all rows still decoding, and assert both drafted the same (the alone draft is verified).
    draft_length(step, row index) -> k. leave: {step: row indices that leave the batch before that step}."""
    target, leave = TargetModel(model), leave or {}
    prompts = prompts_of_different_lengths()
    alone = [EagleDrafter(target, head, min_draft_confidence) for _ in prompts]
    batched = BatchEagleDrafter(target, EagleDrafter(target, head, min_draft_confidence), len(prompts))
    rows = []
    for index, prompt in enumerate(prompts):
        cache = target.new_cache()
        hidden = target.forward(prompt, cache)  # [T, hidden]
        engine_generator = torch.Generator().manual_seed(1000 + index)
        first, _ = Sampler(sampling, generator=engine_generator).draw(target.logits(hidden[-1:]))
        rows.append(_Row(index, cache, prompt, int(first[0]), [hidden], [hidden], torch.Generator().manual_seed(index),
                         torch.Generator().manual_seed(index), engine_generator))
    live = list(rows)
    for step in range(num_steps):
        if step in leave:
            kept = [r for r, row in enumerate(live) if row.index not in leave[step]]
            batched.select(torch.tensor(kept))
            live = [live[r] for r in kept]
        contexts, alone_drafts = [], []
        for row in live:
            token_ids = torch.cat([row.token_ids, torch.tensor([row.pending])])
            k = draft_length(step, row.index)
            contexts.append(context(token_ids, row.batch_unseen, k, sampling, row.batch_generator, target))
            row.batch_unseen = []
            if k > 0:
                alone_context = context(token_ids, row.alone_unseen, k, sampling, row.alone_generator, target)
                alone_drafts.append(alone[row.index].propose(alone_context))
                row.alone_unseen = []
            else:
                alone_drafts.append(Draft.empty(token_ids.device))
        batch_drafts = batched.propose(contexts)
        for row, ctx, draft, batch_draft in zip(live, contexts, alone_drafts, batch_drafts):
            assert torch.equal(batch_draft.tokens, draft.tokens), (step, row.index)
            assert (batch_draft.probs is None) == (draft.probs is None), (step, row.index)
            if draft.probs is not None:
                torch.testing.assert_close(batch_draft.probs, draft.probs, rtol=1e-12, atol=1e-12)
            num_tokens = ctx.token_ids.shape[0]
            verdict, accepted, kept_hidden = verify_chain(target, ctx.token_ids[-1:], draft, num_tokens, row.cache,
                                                          Sampler(sampling, generator=row.engine_generator))
            row.token_ids = torch.cat([ctx.token_ids, accepted])
            row.pending = verdict.next_token
            row.alone_unseen.append(kept_hidden)
            row.batch_unseen.append(kept_hidden)
            row.drafts.append((step, ctx.num_draft_tokens, draft, verdict.num_accepted))
    return rows


def varied(step, index):
    """Draft lengths that differ across rows and steps, zeros included."""
    return (3, 2, 0, 1, 4)[(step + index) % 5]


def assert_drafts_exercised(rows, waited: bool = True):
    drafts = [(draft.num_draft_tokens, accepted) for row in rows for _, _, draft, accepted in row.drafts]
    drafted, accepted = sum(d for d, _ in drafts), sum(a for _, a in drafts)
    assert drafted > 0 and 0 < accepted < drafted, (drafted, accepted)  # some accepted, some rejected
    assert any(0 < a < d for d, a in drafts)  # a rollback after a partial acceptance
    if waited:  # a row asked for no drafts: alone its states waited, batched it caught up
        assert any(k == 0 for row in rows for _, k, _, _ in row.drafts)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_batched_drafts_equal_each_rows_own_eagle_drafter(model_and_head, sampling):
    """Catches (planted): a fed draft one position late; the catch-up mask ignoring each row's real length (a plain
    causal mask over the ragged columns); sampled rows drawn in reverse order."""
    model, head = model_and_head
    rows = drive(model, head, sampling, num_steps=14, draft_length=varied)
    assert_drafts_exercised(rows)
    if not sampling.greedy:
        assert any(draft.probs is not None for row in rows for _, _, draft, _ in row.drafts)


def test_each_row_stops_at_its_own_confidence(model_and_head):
    """min_draft_confidence: in one step a row stops short while another drafts all it was asked for; the drafts
    equal each row's own drafter's. Catches (planted): a stop that ends every row's drafting at once."""
    model, head = model_and_head
    # 0.04: this head's top probabilities sit around it (96 tokens), so some rows stop while others go on
    rows = drive(model, head, GREEDY, num_steps=14, draft_length=lambda step, index: 4, min_draft_confidence=0.04)
    assert_drafts_exercised(rows, waited=False)
    by_step = {}
    for row in rows:
        for step, k, draft, _ in row.drafts:
            by_step.setdefault(step, []).append((k, draft.num_draft_tokens))
    assert any(any(n < k for k, n in step) and any(n == k for k, n in step) for step in by_step.values())
    assert any(0 < n < k for step in by_step.values() for k, n in step)  # stopped mid-chain


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_rows_leaving_keep_the_others_right(model_and_head, sampling):
    """Rows leave before any proposal (right after prefill), mid-way and near the end; the rest still draft as they
    would alone. Catches (planted): select not applied to the head cache."""
    model, head = model_and_head
    rows = drive(model, head, sampling, num_steps=12, draft_length=varied, leave={0: [2], 4: [0], 8: [3]})
    assert [len(row.drafts) for row in rows] == [4, 12, 0, 8]
    assert_drafts_exercised(rows)


def test_the_batch_drafts_eagle_in_one_head_forward_per_draft_position(model_and_head, monkeypatch):
    """Through `generate`: at most 1 + (k - 1) head forwards per step (catch-up, then each draft fed back) for all
    rows together, the first over all 4 rows; every row equals its prompt alone, greedy and seeded. Catches
    (planted): the per-row drafters in the batch (4x the forwards, one row each)."""
    model, head = model_and_head
    spec = SelfSpecModel(model, heads=head)
    prompts = prompts_of_different_lengths()
    rows_per_forward = []
    forward = EagleHead.forward

    def counted(self, features, *args, **kwargs):
        rows_per_forward.append(features.shape[0])
        return forward(self, features, *args, **kwargs)

    for options in (dict(), dict(do_sample=True, temperature=0.8, top_k=20, seed=3)):
        options = dict(max_new_tokens=30, num_draft_tokens=3, eos_token_id=[], **options)
        monkeypatch.setattr(EagleHead, "forward", counted)
        rows_per_forward.clear()
        out = spec.generate(prompts, **options)
        monkeypatch.setattr(EagleHead, "forward", forward)
        steps = out.stats.target_forwards - 1  # the prefill drafts nothing
        assert rows_per_forward[0] == 4 and len(rows_per_forward) <= 3 * steps
        assert_exercised(out.row_stats, what="batched eagle")
        for i, (prompt, got) in enumerate(zip(prompts, out.sequences)):
            seed = {"seed": options["seed"] + i} if "seed" in options else {}
            assert torch.equal(got, spec.generate(prompt, **{**options, **seed}).sequences[0]), i


def test_a_row_stopping_early_leaves_the_batched_drafter_too(model_and_head):
    """A row that reaches EOS leaves the batch (and the head cache) while the others go on, each equal to alone."""
    model, head = model_and_head
    spec = SelfSpecModel(model, heads=head)
    prompts = prompts_of_different_lengths()
    options, out = row_zero_stops_early(spec, prompts, num_draft_tokens=3)
    for prompt, got in zip(prompts, out.sequences):
        assert torch.equal(got, spec.generate(prompt, **options).sequences[0])
    assert_exercised(out.row_stats, what="batched eagle, a row leaving")


def test_a_step_where_no_row_drafts_runs_no_head_forward(model_and_head, monkeypatch):
    """Every third step no row drafts (as under the batch width at w = 0): the head is not run then, the rows' states
    wait, and the next proposal catches up on all of them at once; every row still equals its prompt alone. Catches
    (planted): the batched drafter asked on steps where no row drafts (one head forward per such step)."""
    import selfspec.batch.decode

    model, head = model_and_head
    spec = SelfSpecModel(model, heads=head)
    prompts = prompts_of_different_lengths()
    steps, draft_lengths = [], selfspec.batch.decode._draft_lengths

    def every_third_step_none(rows, planner):
        steps.append(len(steps) % 3 != 2)
        return draft_lengths(rows, planner) if steps[-1] else [0] * len(rows)

    forwards, forward = [], EagleHead.forward

    def counted(self, features, *args, **kwargs):
        forwards.append(len(steps))
        return forward(self, features, *args, **kwargs)

    monkeypatch.setattr(selfspec.batch.decode, "_draft_lengths", every_third_step_none)
    monkeypatch.setattr(EagleHead, "forward", counted)
    options = dict(max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
    out = spec.generate(prompts, **options)
    monkeypatch.undo()
    assert not steps[2] and sum(not drafting for drafting in steps) >= 3
    assert not {step for step, drafting in enumerate(steps, 1) if not drafting} & set(forwards)
    assert_exercised(out.row_stats, what="batched eagle with steps at zero")
    for prompt, got in zip(prompts, out.sequences):
        assert torch.equal(got, spec.generate(prompt, **options).sequences[0])


@pytest.mark.parametrize("option", ["head", "full"])
def test_a_batch_drafts_over_the_vocabulary_its_wrapper_was_given(option, monkeypatch):
    """draft_vocab reaches the batch's drafter (it once read the head's draft vocabulary whatever the wrapper said; it
    now takes the wrapper's EagleDrafter), and every row stays its own greedy decoding."""
    model = sharp(tiny_model("llama"))
    vocab = torch.arange(0, 96, 3)  # 32 of 96 tokens
    made, real_init = [], BatchEagleDrafter.__init__

    def recording(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(BatchEagleDrafter, "__init__", recording)
    spec = SelfSpecModel(model, heads=trained_head(model, draft_vocab=vocab, steps=20), draft_vocab=option)
    prompts = [random_prompt(9, seed=1)[0], random_prompt(5, seed=2)[0]]
    out = spec.generate(prompts, max_new_tokens=16, num_draft_tokens=2, eos_token_id=[])
    for sequence, prompt in zip(out.sequences, prompts):
        plain = model.generate(prompt[None], max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)[0]
        assert torch.equal(sequence, plain)
    assert made, "the batch never built its EAGLE drafter"
    assert (made[-1].projected_vocab is None) == (option == "full")
    assert_exercised(out.stats, rejected=False, what=f"a batch drafting over draft_vocab={option!r}")
