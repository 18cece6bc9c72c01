"""The scheduler's continuous batches with a real tiny engine: jobs that arrive while others decode join them (rows
really overlap), each answer equals `generate`'s for its prompt and arguments (greedy and seeded) whatever the
settings of the rows beside it, a cancelled row leaves at the next step while the others finish, a job the batch
cannot take fails alone, and the queue bound counts the batch's free rows.
Batches are shaped deterministically here: a first job held at a gate, the next ones joining it at its first step."""
from __future__ import annotations

import threading
import time

from selfspec.serve.errors import APIError
from selfspec.serve.scheduler import Failed, Finished, Job, Piece, Scheduler
from tests.selfspec.serve.live import tiny_engine
from tests.selfspec.serve.paced import PacedEngine
from tests.selfspec.serve.test_scheduler import Recorder, _wait_until

PROMPTS = [[5, 9, 13, 5, 9, 13, 5, 9], [21, 4, 4, 30], [7, 7, 8, 7, 7, 8, 7], [40, 41, 42, 43, 44, 45]]
SAMPLED = {"do_sample": True, "temperature": 0.9, "top_p": None, "top_k": None}


def expected(engine, job: Job) -> list[int]:
    return engine.generate(job.prompt_ids, **job.generate_kwargs()).sequences[0, len(job.prompt_ids):].tolist()


def with_a_held_first_job(engine, delay=0.02, max_queue=8, max_batch=4):
    """A scheduler whose first job waits at a gate: -> (scheduler, its recorder, open)."""
    gate = threading.Event()
    paced = PacedEngine(engine, delay=delay, gate=gate)
    scheduler = Scheduler(paced, max_queue=max_queue, max_batch=max_batch)
    first = Recorder()
    scheduler.submit(Job(PROMPTS[3], 3), first)
    _wait_until(lambda: scheduler.active == 1)
    return scheduler, first, gate.set


def tokens_of(recorder: Recorder) -> list[int]:
    return [t for event in recorder.events if isinstance(event, Piece) for t in event.token_ids]


def test_jobs_arriving_while_others_decode_join_the_batch_and_answer_as_alone():
    engine = tiny_engine()
    scheduler, first, release = with_a_held_first_job(engine)
    widest, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            widest[0] = max(widest[0], scheduler.active)
            time.sleep(0.002)
    watcher = threading.Thread(target=watch)
    watcher.start()
    jobs = [Job(PROMPTS[0], 40, num_draft_tokens=3), Job(PROMPTS[1], 12, num_draft_tokens=3),
            Job(PROMPTS[2], 30, seed=4, num_draft_tokens=3), Job(PROMPTS[3], 25, num_draft_tokens=3)]
    recorders = [Recorder() for _ in jobs]
    for job, recorder in zip(jobs[:2], recorders):  # queued while the held job waits: they join it at its first step
        scheduler.submit(job, recorder)
    release()
    assert isinstance(first.wait(), Finished)
    for job, recorder in zip(jobs[2:], recorders[2:]):  # arriving while the batch decodes: they join it
        scheduler.submit(job, recorder)
        time.sleep(0.05)
    ends = [recorder.wait() for recorder in recorders]
    stop.set()
    watcher.join()
    scheduler.close(grace_s=5)
    assert widest[0] >= 3, f"at most {widest[0]} rows decoded together"
    for job, recorder, end in zip(jobs, recorders, ends):
        assert isinstance(end, Finished), end
        assert tokens_of(recorder) == expected(engine, job)
        text = "".join(e.text for e in recorder.events if isinstance(e, Piece))
        assert text == engine.tokenizer.decode(tokens_of(recorder), skip_special_tokens=True)
        assert end.completion_tokens == len(tokens_of(recorder)) and end.stats.new_tokens == end.completion_tokens
    assert sum(end.stats.drafted for end in ends) > 0  # (n-gram drafts on the repetitive prompts)


def assert_batched_jobs_answer_as_alone(jobs: list[Job]) -> None:
    """The jobs queue behind a held job and decode in continuous batches; each answers as `generate` alone."""
    engine = tiny_engine()
    scheduler, _, release = with_a_held_first_job(engine, delay=0.01)
    recorders = [Recorder() for _ in jobs]
    for job, recorder in zip(jobs, recorders):
        scheduler.submit(job, recorder)
    release()
    for job, recorder in zip(jobs, recorders):
        assert isinstance(recorder.wait(), Finished)
        assert tokens_of(recorder) == expected(engine, job)
    scheduler.close(grace_s=5)


def test_seeded_rows_batch_together_and_keep_their_seeds():
    assert_batched_jobs_answer_as_alone([Job(p, 20, sampling=SAMPLED, seed=10 + i, num_draft_tokens=2)
                                         for i, p in enumerate(PROMPTS)])


def test_jobs_of_different_settings_share_the_batch_and_each_answers_as_alone():
    assert_batched_jobs_answer_as_alone([
        Job(PROMPTS[0], 15), Job(PROMPTS[1], 10, sampling=SAMPLED, seed=3),
        Job(PROMPTS[2], 8, sampling={**SAMPLED, "temperature": 1.4, "top_p": 0.8}, seed=9), Job(PROMPTS[3], 12)])


def test_a_cancelled_row_leaves_at_the_next_step_and_the_others_finish():
    engine = tiny_engine()
    scheduler, _, release = with_a_held_first_job(engine)
    long_job, other = Job(PROMPTS[0], 300), Job(PROMPTS[1], 30)
    cancelled, kept = Recorder(), Recorder()
    ticket = scheduler.submit(long_job, cancelled)
    scheduler.submit(other, kept)
    release()
    _wait_until(lambda: scheduler.active == 2 and tokens_of(cancelled))
    ticket.cancel()
    end = cancelled.wait()
    assert isinstance(end, Failed) and end.error.status == 499
    assert len(tokens_of(cancelled)) < 300
    assert isinstance(kept.wait(), Finished) and tokens_of(kept) == expected(engine, other)
    _wait_until(lambda: scheduler.active == 0)
    scheduler.close(grace_s=5)


def test_the_queue_bound_counts_the_batchs_free_rows():
    scheduler, first, release = with_a_held_first_job(tiny_engine(), max_queue=1, max_batch=2)
    recorders = [Recorder() for _ in range(2)]
    for recorder in recorders:  # one decoding (held at the gate), one for the free row, one waiting
        scheduler.submit(Job(PROMPTS[0], 4), recorder)
    try:
        scheduler.submit(Job(PROMPTS[0], 4), Recorder())
        raise AssertionError("a fourth job was accepted")
    except APIError as refused:
        assert refused.status == 429
    release()
    assert all(isinstance(recorder.wait(), Finished) for recorder in [first, *recorders])
    scheduler.close(grace_s=5)


def test_a_job_the_batch_cannot_take_fails_alone_with_a_400():
    engine = tiny_engine()
    scheduler, first, release = with_a_held_first_job(engine)
    refused, kept = Recorder(), Recorder()
    scheduler.submit(Job(PROMPTS[0], engine.target.max_positions), refused)  # prompt + budget past the context
    scheduler.submit(Job(PROMPTS[1], 6), kept)
    release()
    end = refused.wait()
    assert isinstance(end, Failed) and end.error.status == 400 and "context window" in end.error.message
    assert isinstance(kept.wait(), Finished) and isinstance(first.wait(), Finished)
    assert tokens_of(kept) == expected(engine, Job(PROMPTS[1], 6))
    scheduler.close(grace_s=5)
