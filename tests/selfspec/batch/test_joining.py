"""Rows that join a running batch between steps and leave it (continuous batching): every row's tokens are its
prompt's alone (greedy, and sampled with its own seed), whatever joins or leaves around it, for every drafter; rows
really overlapped, drafts were proposed, accepted and rejected; a row ended between steps stops there."""
import pytest
import torch

from selfspec.batch.joining import JoiningBatch, RowRequest
from selfspec.sampling import SamplingConfig
from tests.selfspec.batch.test_decode import engine, prompts_of_different_lengths
from tests.selfspec.exercised import assert_exercised

SEEDED = SamplingConfig(do_sample=True, temperature=0.8)


def run(batch: JoiningBatch, requests: list[RowRequest], joins: dict[int, list[int]], end_at=None):
    """Start with the requests not in `joins`; before step s, admit the requests joins[s] names. end_at: {step: index}
    ends that row before that step. -> ({index: tokens}, {index: stats}, the largest number of rows decoding at once)."""
    later = {i for indices in joins.values() for i in indices}
    first = [r for r in requests if r.index not in later]
    tokens, stats, step, live, widest = {r.index: [] for r in requests}, {}, 0, set(), 0
    live.update(r.index for r in first)

    def admit():
        joining = [requests[i] for i in joins.get(step, [])]
        live.update(r.index for r in joining)
        return joining
    for emitted, finished in batch.steps(first, admit):
        widest = max(widest, len(live))
        for index, new in emitted:
            tokens[index] += new
        for done in finished:
            stats[done.index] = done.stats
            live.discard(done.index)
        step += 1
        if end_at and step in end_at:
            batch.end(end_at[step])
            live.discard(end_at[step])
    return tokens, stats, widest


@pytest.mark.parametrize("drafter", ["ngram", "medusa", "eagle", "early_exit"])
def test_greedy_rows_joining_and_leaving_equal_each_prompt_alone(drafter):
    spec = engine("llama", drafter)
    prompts = prompts_of_different_lengths()
    budgets = [30, 12, 25, 18]
    requests = [RowRequest(i, p.tolist(), n) for i, (p, n) in enumerate(zip(prompts, budgets))]
    batch = JoiningBatch(spec, SamplingConfig(), num_draft_tokens=3)
    tokens, stats, widest = run(batch, requests, joins={2: [2], 5: [3]})
    assert widest >= 3 and set(stats) == {0, 1, 2, 3}  # rows overlapped; every row reported finished
    for request in requests:
        expected = spec.generate(torch.tensor(request.prompt_ids), max_new_tokens=request.max_new_tokens,
                                 num_draft_tokens=3).sequences[0, len(request.prompt_ids):]
        assert tokens[request.index] == expected.tolist(), (drafter, request.index)
    assert_exercised(list(stats.values()), what=f"{drafter} joining rows")


def test_seeded_rows_joining_equal_each_prompt_alone_with_its_seed():
    spec = engine("llama", "ngram")
    prompts = prompts_of_different_lengths()
    requests = [RowRequest(i, p.tolist(), 20, seed=100 + i) for i, p in enumerate(prompts)]
    batch = JoiningBatch(spec, SEEDED, num_draft_tokens=2)
    tokens, stats, widest = run(batch, requests, joins={1: [1, 3], 4: [2]})
    assert widest >= 3
    for request in requests:
        alone = spec.generate(torch.tensor(request.prompt_ids), max_new_tokens=20, num_draft_tokens=2,
                              do_sample=True, temperature=0.8, seed=request.seed).sequences[0, len(request.prompt_ids):]
        assert tokens[request.index] == alone.tolist()


@pytest.mark.parametrize("drafter", ["ngram", "eagle"])
def test_rows_of_different_settings_share_a_batch_and_each_decodes_as_alone(drafter):
    """Greedy, seeded at two temperatures (one with top-p) and unseeded rows in one batch: the greedy and seeded rows
    are their prompts' tokens alone (the unseeded one only has to decode: its law is the sampled law tests')."""
    spec = engine("llama", drafter)
    prompts = prompts_of_different_lengths()
    hot = SamplingConfig(do_sample=True, temperature=1.3, top_p=0.9)
    requests = [RowRequest(0, prompts[0].tolist(), 40), RowRequest(1, prompts[1].tolist(), 40, seed=7, sampling=SEEDED),
                RowRequest(2, prompts[2].tolist(), 40, seed=8, sampling=hot),
                RowRequest(3, prompts[3].tolist(), 40, sampling=SEEDED)]  # (no seed: rejection sampling)
    tokens, stats, widest = run(JoiningBatch(spec, num_draft_tokens=3), requests, joins={1: [2], 3: [3]})
    assert widest >= 3 and len(tokens[3]) == 40
    for request in requests[:3]:
        options = dict(max_new_tokens=40, num_draft_tokens=3)
        if request.sampling is not None:
            options.update(do_sample=True, temperature=request.sampling.temperature, top_p=request.sampling.top_p,
                           seed=request.seed)
        alone = spec.generate(torch.tensor(request.prompt_ids), **options).sequences[0, len(request.prompt_ids):]
        assert tokens[request.index] == alone.tolist(), request.index
    assert_exercised([stats[i] for i in range(3)], what=f"{drafter} rows of different settings")


def test_a_request_the_batch_cannot_take_fails_alone():
    spec = engine("llama", "ngram")
    prompts = prompts_of_different_lengths()
    too_long = RowRequest(1, prompts[1].tolist(), spec.target.max_positions)  # prompt + budget past the context
    requests = [RowRequest(0, prompts[0].tolist(), 10), too_long, RowRequest(2, prompts[2].tolist(), 10)]
    batch = JoiningBatch(spec, SamplingConfig(), num_draft_tokens=2)
    admitted, errors, finished_ok = [], {}, set()

    def admit():
        pending = [r for r in requests[1:] if r.index not in admitted]
        admitted.extend(r.index for r in pending)
        return pending
    for _, finished in batch.steps(requests[:1], admit):
        for row in finished:
            if row.error is not None:
                errors[row.index] = row.error
            else:
                finished_ok.add(row.index)
    assert set(errors) == {1} and "context window" in str(errors[1]) and finished_ok == {0, 2}
    only_refused = list(JoiningBatch(spec, SamplingConfig()).steps([too_long], list))
    assert len(only_refused) == 1 and only_refused[0][1][0].error is not None


def test_a_row_ended_between_steps_stops_and_the_others_go_on():
    spec = engine("llama", "ngram")
    prompts = prompts_of_different_lengths()
    requests = [RowRequest(i, p.tolist(), 24) for i, p in enumerate(prompts[:3])]
    batch = JoiningBatch(spec, SamplingConfig(), num_draft_tokens=2)
    tokens, stats, _ = run(batch, requests, joins={}, end_at={3: 1})
    assert 1 not in stats and {0, 2} <= set(stats)  # ended: not reported as finished
    assert 1 <= len(tokens[1]) < 24
    alone = spec.generate(torch.tensor(requests[1].prompt_ids), max_new_tokens=24, num_draft_tokens=2).sequences[0]
    assert tokens[1] == alone[len(requests[1].prompt_ids):].tolist()[:len(tokens[1])]
