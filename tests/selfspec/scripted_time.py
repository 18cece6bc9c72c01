"""Scripted time for timing tests: a clock that moves only when told, and target forwards that advance it by a
scripted cost. Timing behaviour is then tested exactly, with no wall-clock threshold to flake on a busy machine."""
from __future__ import annotations


class ScriptedClock:
    """Seconds that pass only through `advance` (a forward's scripted cost, a consumer's scripted pause)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def scripted_forwards(target, clock: ScriptedClock, seconds_for_tokens):
    """Make every full forward of `target` (a TargetModel) advance `clock` by seconds_for_tokens(num_tokens); returns
    the list that records each forward's token count."""
    forward, counts = target.forward, []

    def timed(token_ids, *args, **kwargs):
        counts.append(token_ids.shape[0])
        clock.advance(seconds_for_tokens(token_ids.shape[0]))
        return forward(token_ids, *args, **kwargs)

    target.forward = timed  # an instance attribute: only this target, only this test
    return counts


def scripted_engine_clock(spec, seconds_for_tokens) -> tuple[ScriptedClock, list]:
    """Give a SelfSpecModel a scripted clock (its public `clock` hook) whose time passes only in target forwards."""
    clock = ScriptedClock()
    spec.clock = clock
    return clock, scripted_forwards(spec.target, clock, seconds_for_tokens)


def scripted_batch_clock(spec, monkeypatch, seconds_for_tokens) -> ScriptedClock:
    """The engine's clock moves only in the batch's target forwards, by seconds_for_tokens(all tokens of the block)."""
    import selfspec.batch.decode as batch

    clock, forward = ScriptedClock(), batch._forward_block
    spec.clock = clock

    def timed(target, cache, block_ids, *prefilled):
        clock.advance(seconds_for_tokens(block_ids.numel()))
        return forward(target, cache, block_ids, *prefilled)

    monkeypatch.setattr(batch, "_forward_block", timed)
    return clock
