"""Early exit for several prompts at once (`drafters/early_exit_batch.py`): every row equals its prompt decoded alone
(greedy and seeded sampling; exit adapter, confidence stops, probes, rows that stop early), the first layers run once
per block entry (drafting) and verification resumes after them, and after every step each row's keys and values in
every layer are plain decoding's. (Greedy and sampled rows across families with the other drafters: test_batch.py.)"""
import pytest
import torch

import selfspec.batch.cache
from selfspec import SelfSpecModel
from selfspec.draft_length.batch import BatchDraftLength
from selfspec.draft_length.verify_cost import VerifyCost
from tests.selfspec.exercised import assert_exercised, exit_confidences, greedy_sequences
from tests.selfspec.scripted_time import scripted_batch_clock
from tests.selfspec.batch.test_decode import alone, early_exit_model, prompts_of_different_lengths
from tests.selfspec.drafters.test_early_exit import randomized_adapter


@pytest.mark.parametrize("family", ["gpt2", "gemma"])
def test_greedy_rows_with_an_adapter_and_a_confidence_stop_equal_alone(family):
    """Learned positions (GPT-2) and a scaled embedding (Gemma) through the batched first layers; an exit adapter; a
    confidence floor (the median confidence of layer 2's drafts along row 0's output) that stops some rows' chains
    mid-way and others before their first draft, so rows draft different lengths in one step. Each row drafts and
    accepts what it does alone. Catches (planted): the batch ignoring the adapter, or the confidence floor."""
    prompts = prompts_of_different_lengths()
    model = early_exit_model(family)
    expected = greedy_sequences(model, [p[None] for p in prompts], 24)
    median = float(exit_confidences(SelfSpecModel(model, drafter="none").target, expected[0], 2).median())
    stats = []
    for adapter, confidence in ((randomized_adapter(model, 2), 0.0), (None, median)):
        spec = SelfSpecModel(model, drafter="early_exit", exit_layer=2, adapter=adapter,
                             min_draft_confidence=confidence)
        options = dict(max_new_tokens=24, num_draft_tokens=4, eos_token_id=[])
        out = spec.generate(prompts, **options)
        for prompt, got, plain, row in zip(prompts, out.sequences, expected, out.row_stats):
            assert torch.equal(got, plain)
            single = spec.generate(prompt, **options)
            assert torch.equal(got, single.sequences[0])
            # the same drafts as alone (the adapter's, cut by the same confidence stops), accepted alike
            assert (row.drafted, row.accepted) == (single.stats.drafted, single.stats.accepted)
        assert_exercised(out.row_stats, what=f"{family} adapter={adapter is not None} confidence={confidence:.2f}")
        stats.append(out.row_stats)
    capped = stats[1]  # the confidence floor drafted fewer than 4 per step in some rows
    assert sum(s.drafted for s in capped) < 4 * sum(s.target_forwards - 1 for s in capped)


def test_the_first_layers_run_once_per_block_entry_and_verification_resumes_after_them():
    """Tokens through each layer: with shared work every layer sees each row's block entries once (the first two
    while drafting, the last two while verifying); share_work=False (the naive reference) runs the first layers over
    every block twice. Catches (planted): verification running every layer again."""
    prompts = prompts_of_different_lengths()
    model = early_exit_model()
    SelfSpecModel(model, drafter="ngram").generate(prompts, max_new_tokens=1)  # the batch's once-per-model check
    counts = {}
    for share_work in (True, False):
        spec = SelfSpecModel(model, drafter="early_exit", exit_layer=2, share_work=share_work)
        seen = [0] * 4
        hooks = [layer.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, seen[i] + args[0].shape[0]
                                                                                          * args[0].shape[1]))
                 for i, layer in enumerate(spec.target.parts.layers)]
        try:
            out = spec.generate(prompts, max_new_tokens=20, num_draft_tokens=3, eos_token_id=[])
        finally:
            for hook in hooks:
                hook.remove()
        for prompt, got in zip(prompts, out.sequences):
            assert torch.equal(got, alone(spec, prompt, max_new_tokens=20, num_draft_tokens=3, eos_token_id=[]))
        assert_exercised(out.row_stats, what=f"share_work={share_work}")
        counts[share_work] = seen
    shared, naive = counts[True], counts[False]
    assert shared[0] == shared[1] == shared[2] == shared[3]  # one pass of every layer over each entry
    assert naive[2] == naive[3] == shared[3] and naive[0] == naive[1] > shared[0]  # drafted layers ran again


def test_after_every_step_each_rows_cache_holds_plain_decodings_keys_and_values(monkeypatch):
    """Snapshot the batch's cache after every commit: in every layer (the drafted ones included) each row's committed
    entries equal a fresh prefill of that row's committed tokens, and no layer holds more columns than the widest row
    (rejected drafts are gone). Sampled with a seed per row: at a fixed k, and with "auto" (the batch's planner)."""
    prompts = prompts_of_different_lengths()
    model = early_exit_model("qwen2")
    snapshots = []
    commit = selfspec.batch.cache.RaggedCache.commit

    def recording_commit(cache, kept):
        commit(cache, kept)
        snapshots[-1].append((cache.lengths.clone(), [(layer.keys.clone(), layer.values.clone())
                                                      for layer in cache.hf_cache.layers]))

    monkeypatch.setattr(selfspec.batch.cache.RaggedCache, "commit", recording_commit)
    spec = SelfSpecModel(model, drafter="early_exit", exit_layer=1)
    stats = []
    for k in (3, "auto"):
        options = dict(max_new_tokens=30, num_draft_tokens=k, do_sample=True, temperature=0.9, eos_token_id=[])
        snapshots.append([])
        out = spec.generate(prompts, seed=3, **options)
        with monkeypatch.context() as alone_commits:  # (alone, nothing is recorded)
            alone_commits.setattr(selfspec.batch.cache.RaggedCache, "commit", commit)
            for i, (prompt, got) in enumerate(zip(prompts, out.sequences)):
                assert torch.equal(got, alone(spec, prompt, seed=3 + i, **options)), (k, i)
        stats += out.row_stats
        assert_exercised(out.row_stats, rejected=False, what=f"sampled early exit, num_draft_tokens={k}")
        checked = [snapshot for snapshot in snapshots[-1][1:] if snapshot[0].shape[0] == len(prompts)]
        assert len(checked) >= 8  # every step's commit until the first row finished (then rows move up)
        for lengths, layers in checked:
            for keys, values in layers:
                assert keys.shape[-2] == int(lengths.max())
            for r, length in enumerate(lengths.tolist()):
                plain = spec.target.new_cache()
                with torch.no_grad():
                    spec.target.forward(out.sequences[r][:length], plain)
                for (keys, values), layer in zip(layers, plain.hf_cache.layers):
                    torch.testing.assert_close(keys[r, :, :length], layer.keys[0], rtol=0, atol=1e-10)
                    torch.testing.assert_close(values[r, :, :length], layer.values[0], rtol=0, atol=1e-10)
    assert_exercised(stats, what="sampled early exit")


def test_auto_greedy_probes_in_shadow_and_rows_stopping_early_stay_exact(monkeypatch):
    """The batch's own width ("auto", no seed) on a scripted device where verifying costs nearly nothing: it drafts,
    and its probes scored in shadow skip the probe token's pass (the block the forward verifies is one entry wide
    then); a row reaching EOS leaves while the others go on. Every row equals its prompt alone."""
    prompts = prompts_of_different_lengths()
    spec = SelfSpecModel(early_exit_model(), drafter="early_exit", exit_layer=1)
    scripted_batch_clock(spec, monkeypatch, lambda num_tokens: 0.01 * (1 + 0.001 * num_tokens))
    free = spec.generate(prompts, max_new_tokens=30, num_draft_tokens=2, eos_token_id=[]).sequences
    continuations = [s[p.shape[0]:].tolist() for s, p in zip(free, prompts)]
    eos = next(t for t in continuations[0][2:12] if all(t not in c for c in continuations[1:]))
    out = spec.generate(prompts, max_new_tokens=30, eos_token_id=eos)
    lengths = [s.shape[0] - p.shape[0] for s, p in zip(out.sequences, prompts)]
    assert lengths[0] < 12 and max(lengths) == 30
    for prompt, got in zip(prompts, out.sequences):
        assert torch.equal(got, alone(spec, prompt, max_new_tokens=30, num_draft_tokens=2, eos_token_id=eos))
    assert_exercised(out.row_stats, what="auto greedy")
    assert sum(s.probed for s in out.row_stats) > 0, "the test needs probes scored in shadow"


def test_a_step_after_drafted_layers_teaches_the_overhead_not_the_curve():
    """A verify forward that ran only the layers after early exit's is not a price of the batch curve's: the curve
    keeps its prices, and the step beyond a full forward's price is learned as overhead. Catches (planted): the
    partial forward taught as a full one (the curve's price of 3 + 1 tokens falls)."""
    planner = BatchDraftLength(VerifyCost((1.0, 1.2, 1.4, 1.6, 1.8), decode_seconds=0.01))
    before = [planner.cost_curve(n) for n in range(8)]
    for _ in range(6):  # rows=2, width 1: 4 tokens; the partial forward took a third of a decode, the step 2 decodes
        planner.observe([1, 1], 1, verify_seconds=0.0033, step_seconds=0.02, full_forward=False)
    assert [planner.cost_curve(n) for n in range(8)] == before
    assert planner.step_cost(2, 1, 2) == pytest.approx(2.0, rel=0.05)  # the whole step, as timed
