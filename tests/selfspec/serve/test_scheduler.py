"""The scheduler one job at a time (max_batch=1) with a scripted engine (no model): arrival order, the bounded queue,
cancellation of a waiting or a running job, the finish reason, and a close that ends every accepted job (batches:
test_batching.py)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from selfspec.serve.errors import APIError
from selfspec.serve.scheduler import Failed, Finished, Job, Piece, Scheduler

EOS = 1


class ScriptedStream:
    """What SelfSpecModel.stream returns, for a script of steps: each step's tokens, after an optional gate."""

    def __init__(self, steps, gate, delay):
        self.steps, self.gate, self.delay = steps, gate, delay
        self.token_ids = []
        self.stats = SimpleNamespace(target_forwards=len(steps), tokens_per_forward=1.0)
        self.pieces_made = 0

    def __iter__(self):
        if self.gate is not None:
            assert self.gate.wait(timeout=30)
        for tokens in self.steps:
            time.sleep(self.delay)
            self.pieces_made += 1
            self.token_ids += tokens
            yield SimpleNamespace(token_ids=tokens, text="".join(f"<{t}>" for t in tokens))


class ScriptedEngine:
    """Each job's prompt_ids[0] picks its script: the steps it commits (the decoding stops where they end)."""

    def __init__(self, scripts, gate=None, delay=0.0):
        self.model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=EOS))
        self.scripts, self.gate, self.delay = scripts, gate, delay
        self.started, self.streams = [], []

    def stream(self, prompt_ids, max_new_tokens, **options):
        self.started.append(prompt_ids[0])
        stream = ScriptedStream(self.scripts[prompt_ids[0]], self.gate, self.delay)
        self.streams.append(stream)
        return stream


class Recorder:
    def __init__(self):
        self.events = []
        self.done = threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if isinstance(event, (Finished, Failed)):
            self.done.set()

    def wait(self):
        assert self.done.wait(timeout=30), "the job never ended"
        return self.events[-1]


def job(script: int, max_new_tokens: int = 4) -> Job:
    return Job([script], max_new_tokens)


def test_jobs_run_one_at_a_time_in_arrival_order_and_end_once():
    engine = ScriptedEngine({0: [[5], [6, 7]], 1: [[8]], 2: [[9], [EOS]]})
    scheduler = Scheduler(engine, max_queue=4, max_batch=1)
    recorders = [Recorder() for _ in range(3)]
    for i, recorder in enumerate(recorders):
        scheduler.submit(job(i), recorder)
    ends = [recorder.wait() for recorder in recorders]
    assert engine.started == [0, 1, 2]
    assert [e.token_ids for e in recorders[0].events if isinstance(e, Piece)] == [[5], [6, 7]]
    assert [type(e).__name__ for e in recorders[0].events] == ["Piece", "Piece", "Finished"]
    assert [(e.prompt_tokens, e.completion_tokens) for e in ends] == [(1, 3), (1, 1), (1, 2)]
    scheduler.close(grace_s=5)


@pytest.mark.parametrize("steps, max_new_tokens, reason", [
    ([[5], [6, 7]], 3, "length"),  # the budget ran out
    ([[5], [6, EOS]], 3, "stop"),  # the last token of the budget is an EOS
    ([[5], [EOS]], 4, "stop"),
    ([[5]], 4, "stop"),  # ended early: a stop string or an EOS
])
def test_the_finish_reason(steps, max_new_tokens, reason):
    scheduler = Scheduler(ScriptedEngine({0: steps}), max_queue=0, max_batch=1)
    recorder = Recorder()
    scheduler.submit(job(0, max_new_tokens), recorder)
    assert recorder.wait().finish_reason == reason
    scheduler.close(grace_s=5)


def test_a_full_queue_refuses_with_429_and_cancelled_waiters_free_their_place():
    gate = threading.Event()
    scheduler = Scheduler(ScriptedEngine({0: [[5]]}, gate=gate), max_queue=1, max_batch=1)
    first, second, third = Recorder(), Recorder(), Recorder()
    scheduler.submit(job(0), first)
    _wait_until(lambda: scheduler.active == 1)
    waiting = scheduler.submit(job(0), second)
    with pytest.raises(APIError) as caught:
        scheduler.submit(job(0), third)
    assert caught.value.status == 429 and caught.value.headers["Retry-After"]
    waiting.cancel()  # leaves the queue at once
    assert isinstance(second.wait(), Failed) and scheduler.depth == 0
    scheduler.submit(job(0), third)
    gate.set()
    assert isinstance(first.wait(), Finished) and isinstance(third.wait(), Finished)
    scheduler.close(grace_s=5)


def test_cancelling_a_running_job_frees_the_worker_at_its_next_step():
    engine = ScriptedEngine({0: [[5]] * 1000, 1: [[6]]}, delay=0.01)
    scheduler = Scheduler(engine, max_queue=2, max_batch=1)
    long, short = Recorder(), Recorder()
    ticket = scheduler.submit(job(0, 1000), long)
    scheduler.submit(job(1), short)
    _wait_until(lambda: len(long.events) >= 3)
    ticket.cancel()
    assert isinstance(short.wait(), Finished)
    assert engine.streams[0].pieces_made < 50  # stopped after the step that was running, not after 1000
    assert isinstance(long.wait(), Failed)
    scheduler.close(grace_s=5)


def test_close_finishes_within_the_grace_then_fails_the_rest():
    gate = threading.Event()
    scheduler = Scheduler(ScriptedEngine({0: [[5]]}, gate=gate), max_queue=3, max_batch=1)
    recorders = [Recorder() for _ in range(3)]
    for recorder in recorders:
        scheduler.submit(job(0), recorder)
    started = time.monotonic()
    closer = threading.Thread(target=scheduler.close, kwargs={"grace_s": 0.3})
    closer.start()
    _wait_until(lambda: not scheduler._accepting)
    with pytest.raises(APIError) as caught:
        scheduler.submit(job(0), Recorder())
    assert caught.value.status == 503
    time.sleep(0.5)
    gate.set()  # the running job's first step comes after the grace: it is failed at that step
    closer.join(timeout=30)
    assert not closer.is_alive() and time.monotonic() - started < 30
    ends = [recorder.wait() for recorder in recorders]
    assert all(isinstance(end, Failed) and end.error.status == 503 for end in ends)


def test_close_lets_quick_jobs_finish():
    scheduler = Scheduler(ScriptedEngine({0: [[5], [6]]}), max_queue=3, max_batch=1)
    recorders = [Recorder() for _ in range(3)]
    for recorder in recorders:
        scheduler.submit(job(0), recorder)
    scheduler.close(grace_s=30)
    assert all(isinstance(recorder.wait(), Finished) for recorder in recorders)


def test_a_failing_job_fails_alone():
    class Broken(ScriptedEngine):
        def stream(self, prompt_ids, **options):
            if prompt_ids[0] == 0:
                raise RuntimeError("boom")
            return super().stream(prompt_ids, **options)

    scheduler = Scheduler(Broken({1: [[5]]}), max_queue=2, max_batch=1)
    broken, fine = Recorder(), Recorder()
    scheduler.submit(job(0), broken)
    scheduler.submit(job(1), fine)
    assert broken.wait().error.status == 500 and "boom" in broken.wait().error.message
    assert isinstance(fine.wait(), Finished)
    scheduler.close(grace_s=5)


def _wait_until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
