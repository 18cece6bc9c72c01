"""The decode loop's contract with its helpers: one piece per target forward, stats that time only engine work (with
a scripted clock), DraftContext.hidden_states covering every committed position once, and "auto" turning drafting
off when drafting costs more than it saves (early exit included) and back on when it pays again."""
import torch

from selfspec import SelfSpecModel
from selfspec.draft_length.policy import AdaptiveDraftLength
from selfspec.draft_length.verify_cost import VerifyCost, prior_verify_cost
from tests.conftest import random_prompt, repetitive_prompt, tiny_model


class ScriptedClock:
    """Seconds that move only when the test says so (plus `tick` per reading)."""

    def __init__(self, tick: float = 0.0):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_one_piece_per_target_forward_the_prefill_token_first():
    spec = SelfSpecModel(tiny_model("llama"), drafter="ngram")
    stream = spec.stream(repetitive_prompt(20, seed=1), max_new_tokens=30, num_draft_tokens=4, eos_token_id=[])
    pieces = list(stream)
    assert len(pieces) == stream.stats.target_forwards and len(pieces[0].token_ids) == 1
    assert sum(len(p.token_ids) for p in pieces) == 30 and stream.stats.accepted > 0


def test_consumer_time_is_not_engine_time():
    clock = ScriptedClock(tick=0.001)
    spec = SelfSpecModel(tiny_model("llama"), drafter="ngram")
    spec.clock = clock
    stream = spec.stream(random_prompt(), max_new_tokens=10, num_draft_tokens=2, eos_token_id=[])
    readings = 0
    for _ in stream:
        clock.now += 100.0  # a slow consumer between pieces
        readings += 1
    assert readings == stream.stats.target_forwards
    assert 0 < stream.stats.seconds < 1.0  # only the engine's own readings, never the consumer's 100 s


class _RecordingNgram:
    """Records every context; proposes nothing useful (the test is about what it is shown)."""

    def __init__(self):
        self.contexts = []

    def propose(self, context):
        from selfspec import Draft

        self.contexts.append(context)
        return Draft(context.token_ids[-context.num_draft_tokens :].clone())

    def observe(self, num_drafted, num_accepted):
        pass


class _Alternating:
    """Draft-length policy: k = 0, 0, 2, 0, 3, ... (steps without a proposal between proposals)."""

    def __init__(self):
        self.steps = 0

    def choose(self):
        self.steps += 1
        return (0, 0, 2, 0, 3)[self.steps % 5]

    def observe(self, num_drafted, num_accepted, seconds=None):
        pass


def test_hidden_states_cover_every_committed_position_once():
    model = tiny_model("llama", seed=3)
    drafter = _RecordingNgram()
    prompt = repetitive_prompt(12, seed=4)
    out = SelfSpecModel(model, drafter=drafter).generate(
        prompt, max_new_tokens=30, num_draft_tokens=_Alternating(), eos_token_id=[]
    )
    with torch.no_grad():
        full = model.get_decoder()(input_ids=out.sequences).last_hidden_state[0]  # [T, hidden]
    next_index = 1  # the first context starts at the state predicting token 1 (the whole prompt's prefill)
    for context in drafter.contexts:
        num_tokens, num_new = context.token_ids.shape[0], context.hidden_states.shape[0]
        first = num_tokens - num_new  # token index the first row predicts
        assert first == next_index, "a position was skipped or shown twice"
        torch.testing.assert_close(context.hidden_states, full[first - 1 : num_tokens - 1], rtol=0, atol=1e-10)
        assert torch.equal(context.hidden_states[-1], context.hidden_state)
        next_index = num_tokens
    assert len(drafter.contexts) >= 4 and max(c.hidden_states.shape[0] for c in drafter.contexts[1:]) >= 3


def test_auto_stops_drafting_when_drafting_costs_more_than_it_saves_and_comes_back():
    """Scripted step times: drafts accepted at 0.7 per position, each draft token costing a whole decode to make
    (a slow early exit) -> k falls to 0; then drafting becomes free -> the probes bring k back."""
    decode = 0.01
    cost = VerifyCost(prior_verify_cost(torch.device("cpu")).relative, decode)
    policy = AdaptiveDraftLength(cost, prior_acceptance=0.7)
    g = torch.Generator().manual_seed(0)

    def run(steps, draft_cost):
        chosen = []
        for _ in range(steps):
            k = policy.choose()
            accepted = 0
            while accepted < k and torch.rand(1, generator=g).item() < 0.7:
                accepted += 1
            policy.observe(k, accepted, seconds=decode * (cost(k) + draft_cost * k))
            chosen.append(k)
        return chosen

    costly = run(200, draft_cost=1.0)
    assert costly[-80:].count(0) >= 64  # off, except single-token probes
    cheap = run(300, draft_cost=0.0)
    assert sum(cheap[-50:]) / 50 >= 2


def test_auto_turns_early_exit_off_when_its_drafting_is_costly():
    """Engine-level, with a scripted clock: the early-exit partial forwards are made to cost 90 % of a decode each.
    The drafter's own cost estimate is zeroed, so only the timings can teach the policy the difference."""
    model = tiny_model("llama", seed=5, num_layers=4)
    prompt = repetitive_prompt(16, seed=6)
    expected = model.generate(
        prompt, max_new_tokens=60, do_sample=False, eos_token_id=None, pad_token_id=2, attention_mask=torch.ones_like(prompt)
    )
    drafted = {}
    for draft_cost in (0.0, 0.9):
        clock = ScriptedClock()
        spec = SelfSpecModel(model, drafter="early_exit", exit_layer=3)
        spec.clock, spec.drafter.draft_cost = clock, 0.0
        forward, exit_forward = spec.target.forward, spec.target.exit_forward

        def timed_forward(token_ids, cache, *args, **kwargs):
            clock.now += 0.01 * (1 + 0.1 * (token_ids.shape[0] - 1))
            return forward(token_ids, cache, *args, **kwargs)

        def timed_exit_forward(token_ids, cache, exit_layer):
            clock.now += 0.01 * draft_cost
            return exit_forward(token_ids, cache, exit_layer)

        spec.target.forward, spec.target.exit_forward = timed_forward, timed_exit_forward
        out = spec.generate(prompt, max_new_tokens=60, eos_token_id=[])  # default: auto
        assert torch.equal(out.sequences, expected)
        drafted[draft_cost] = out.stats.drafted
    assert drafted[0.0] > 0 and drafted[0.9] < drafted[0.0] / 2
