"""Running methods side by side: every method on every prompt and mode, rounds after rounds, in a fresh random order
for every (round, prompt, mode), under an optional deadline. Knows nothing about what a method does or about reports.
"""
from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass

import torch

from selfspec.bench.methods import GREEDY, SAMPLE, Method, Mode, Run


@dataclass(frozen=True)
class Entry:
    method: Method
    mode: Mode
    round: int
    prompt: int
    run: Run


class Deadline:
    """seconds=None: never passes."""

    def __init__(self, seconds: float | None):
        self.at = None if seconds is None else time.perf_counter() + seconds

    @property
    def passed(self) -> bool:
        return self.at is not None and time.perf_counter() >= self.at


def run_schedule(methods: list[Method], prompts: list[torch.Tensor], modes, repeats: int, seed: int, label: str,
                 deadline: Deadline, modes_of: dict[str, tuple[Mode, ...]] | None = None) -> tuple[list[Entry], bool]:
    """(entries of the finished rounds, True if the deadline stopped it). The method order is shuffled for each
    (round, prompt, mode) so no method always follows another (caches, allocator and CPU-frequency state are shared);
    a round the deadline interrupts is dropped whole, so every kept round has every method on every prompt.
    modes_of: {method name: the modes it runs in} for methods that run in only some of `modes` (others run in all)."""
    entries, started = [], time.perf_counter()
    runs_in = lambda method, mode: mode in (modes_of or {}).get(method.name, modes)  # noqa: E731
    total = repeats * len(prompts) * sum(runs_in(method, mode) for method in methods for mode in modes)
    for round_ in range(repeats):
        this_round = []
        for p, prompt in enumerate(prompts):
            for m, mode in enumerate(modes):
                order = [method for method in methods if runs_in(method, mode)]
                random.Random(f"{seed}/{round_}/{p}/{m}").shuffle(order)
                for method in order:
                    if deadline.passed:
                        print(f"  {label}: time limit, round {round_ + 1} dropped", file=sys.stderr, flush=True)
                        return entries, True
                    run_seed = seed * 1_000_003 + round_ * 1009 + p  # the same for every method: paired runs
                    this_round.append(Entry(method, mode, round_, p, method.run(prompt, mode, run_seed)))
            done = len(entries) + len(this_round)
            print(f"  {label}: {done}/{total} runs, {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
        entries += this_round
    return entries, False


WARM_UP_TOKENS = 16  # enough for first-call allocations and a kernel's first use; a full run would cost minutes


def warm_up(methods: list[Method], prompt: torch.Tensor, modes=(GREEDY, SAMPLE),
            modes_of: dict[str, tuple[Mode, ...]] | None = None) -> None:
    """One short run of each method in each mode it runs in, on a short prompt: first-call allocations, and any
    first-use measurement a SelfSpecModel makes, happen here, not in a timed round."""
    for method in methods:
        for mode in (modes_of or {}).get(method.name, modes):
            method.run(prompt, mode, 0, max_new_tokens=WARM_UP_TOKENS)
