"""The benchmark's contestants: one decoding method each (`model.generate` and its assisted variants, selfspec's
drafters), all run the same way on one prompt and measured the same way. Knows nothing about schedules or reports.

Every run is timed from outside (wall clock around the call, device synchronised), so transformers and selfspec pay
for the same things. Target forwards of transformers' methods are counted with a forward pre-hook on the target
model; from each forward's input length and cache length the hook also recovers how many drafts each verification
step proposed and accepted (`steps_from_calls`), recorded by selfspec's own `StatsRecorder`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from selfspec.drafters.base import Draft, DraftContext
from selfspec.engine import SelfSpecModel
from selfspec.stats import GenerationStats, StatsRecorder


@dataclass(frozen=True)
class Mode:
    """A decoding mode, identical for every method (transformers gets top_k=0: no implicit top-k in any version).

    seeded: selfspec's `generate(seed=...)` with the run's seed (the same for every method on a prompt and round), so
    two methods' tokens can be compared; unseeded sampling draws from the global generator, as a user's call does
    (selfspec: rejection sampling). keyed: an unseeded call that draws a fresh seed from the global generator and
    passes it as seed= (the keyed coupling of `selfspec/seeded.py`, as a `seed=random` default would decode).
    title: the mode's column group in the table.
    """

    name: str
    do_sample: bool
    temperature: float = 1.0
    top_p: float | None = None
    seeded: bool = False
    keyed: bool = False
    title: str = ""

    @property
    def selfspec_only(self) -> bool:
        """Seeded and keyed modes pass selfspec's seed=, which transformers' generate and llama.cpp do not take."""
        return self.seeded or self.keyed


GREEDY = Mode("greedy", False, title="greedy")
SAMPLE = Mode("sample t=0.7 top-p=0.9", True, 0.7, 0.9, title="sampled")
SEEDED = Mode("sample t=0.7 top-p=0.9 seeded", True, 0.7, 0.9, seeded=True, title="seeded")
KEYED = Mode("sample t=0.7 top-p=0.9 keyed", True, 0.7, 0.9, keyed=True, title="keyed")
SAMPLE_T1 = Mode("sample t=1.0", True, 1.0, title="sampled T=1")
KEYED_T1 = Mode("sample t=1.0 keyed", True, 1.0, keyed=True, title="keyed T=1")


def run_seed_argument(mode: Mode, seed: int) -> dict:
    """selfspec's seed= for a run of `mode` whose global generator was just seeded with `seed`: the run's seed
    (seeded), a fresh one drawn from the global generator (keyed), or none (unseeded: rejection sampling)."""
    if mode.seeded:
        return {"seed": seed}
    if mode.keyed:
        return {"seed": int(torch.randint(0, 2**63 - 1, (1,)))}
    return {}


@dataclass
class Run:
    """One generation of one method on one prompt."""

    new_tokens: int
    seconds: float  # wall clock of the whole call: prefill + decode (+ drafting, + building a model if the method does)
    token_ids: list[int]  # the new tokens (greedy runs are compared with plain generate's)
    target_forwards: int | None  # None: not countable
    drafted_by_position: list[int] = field(default_factory=list)  # as in GenerationStats
    accepted_by_position: list[int] = field(default_factory=list)

    @classmethod
    def from_stats(cls, stats: GenerationStats, seconds: float, token_ids: list[int]) -> "Run":
        return cls(stats.new_tokens, seconds, token_ids, stats.target_forwards, list(stats.drafted_by_position),
                   list(stats.accepted_by_position))


@dataclass(frozen=True)
class Method:
    name: str  # e.g. "selfspec medusa (default)"
    family: str  # "transformers" or "selfspec"
    run: Callable[..., Run]  # ([1, T] prompt, mode, seed, max_new_tokens=the method's) -> Run
    drafter: str = "none"  # what drafts: "none", "medusa", "ngram", "early_exit", "eagle", "prompt_lookup", ...
    num_draft_tokens: int | str | None = None  # None: the drafter's default
    extra_parameters: int = 0  # parameters beyond the target model's (heads, draft model)
    spec: SelfSpecModel | None = None  # the SelfSpecModel it keeps (the report reads its measured verify cost)


# -- transformers -------------------------------------------------------------------------------------------------


class ForwardCounter:
    """Records (cache length, input length) of each TARGET forward of `model` while active.

    transformers' early exit drafts with the same module after lowering `config.num_hidden_layers`; those calls are
    drafts, not target forwards, and are skipped.
    """

    def __init__(self, model):
        self.model = model
        self.num_layers = model.config.num_hidden_layers
        self.calls: list[tuple[int, int]] = []
        self._handle = None

    def __enter__(self):
        self.calls = []
        self._handle = self.model.register_forward_pre_hook(self._record, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self._handle.remove()

    def _record(self, module, args, kwargs):
        if self.model.config.num_hidden_layers != self.num_layers:
            return  # an early-exit draft forward
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        cached = cache.get_seq_length() if cache is not None else 0
        self.calls.append((int(cached), int(input_ids.shape[1])))


def steps_from_calls(calls, prompt_len: int, final_len: int) -> list[tuple[int, int]] | None:
    """[(drafted, accepted)] per target forward, from each forward's (cache length, input length).

    A forward's input is the tokens not yet in the cache (the prompt at first, then the last committed token) plus
    the drafts; the next forward's cache length tells how far the sequence advanced: accepted = advance - uncached.
    The last forward's advance comes from the final length (its bonus token never enters the cache).
    None when the calls do not fit that pattern (a transformers version that decodes differently).
    """
    steps = []
    for i, (cached, length) in enumerate(calls):
        uncached = prompt_len - cached if i == 0 else 1
        following = calls[i + 1][0] if i + 1 < len(calls) else final_len - 1
        drafted, accepted = length - uncached, following - cached - uncached
        if drafted < 0 or not 0 <= accepted <= drafted:
            return None
        steps.append((drafted, accepted))
    return steps


def transformers_method(name: str, model, max_new_tokens: int, eos_token_id, pad_token_id, drafter: str = "none",
                        num_draft_tokens=None, extra=None, **assist) -> Method:
    """`model.generate` with `assist` (prompt_lookup_num_tokens=, assistant_early_exit=, assistant_model=)."""
    from selfspec.bench.models import parameters

    counter = ForwardCounter(model)

    def run(prompt: torch.Tensor, mode: Mode, seed: int, max_new_tokens: int = max_new_tokens) -> Run:
        if mode.selfspec_only:
            raise ValueError(f"{name}: transformers has no seed= for generate; run it in the unseeded modes only")
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=mode.do_sample, eos_token_id=eos_token_id,
                      pad_token_id=pad_token_id, attention_mask=torch.ones_like(prompt))
        if mode.do_sample:
            kwargs.update(temperature=mode.temperature, top_p=mode.top_p, top_k=0)
            torch.manual_seed(seed)
        with counter, Timer(prompt.device) as timer:
            sequences = model.generate(prompt, **kwargs, **assist)
        new = sequences[0, prompt.shape[1]:].tolist()
        steps = steps_from_calls(counter.calls, prompt.shape[1], sequences.shape[1]) if drafter != "none" else None
        recorder = StatsRecorder()  # the engine's own stats writer, fed the steps recovered from the forward calls
        for num_drafted, num_accepted in steps or []:
            recorder.stepped(num_drafted, num_accepted, len(new), 0)
        stats = recorder.stats
        stats.new_tokens, stats.target_forwards = len(new), len(counter.calls)
        return Run.from_stats(stats, timer.seconds, new)

    return Method(name, "transformers", run, drafter, num_draft_tokens, parameters(extra)[0])


# -- selfspec -----------------------------------------------------------------------------------------------------


def selfspec_method(name: str, make: Callable[[], SelfSpecModel], max_new_tokens: int, eos_token_id, drafter: str,
                    num_draft_tokens=None, extra=None, fresh: bool = False) -> Method:
    """`SelfSpecModel.generate`, at the drafter's default num_draft_tokens unless one is given.

    make: builds the SelfSpecModel; called once, or inside every timed call when `fresh` (what the command line
    does: wrapping, and any first-use measurement, are then paid by every generation).
    """
    from selfspec.bench.models import parameters

    kept = None if fresh else make()
    options = {} if num_draft_tokens is None else {"num_draft_tokens": num_draft_tokens}

    def run(prompt: torch.Tensor, mode: Mode, seed: int, max_new_tokens: int = max_new_tokens) -> Run:
        # Unseeded sampling: the global generator, seeded as for `transformers` (what a user gets by default). The
        # seeded mode passes seed= itself: reproducible tokens, comparable between methods; the keyed mode a seed
        # drawn from that generator (the same for every method on a prompt and round, so its tokens match too).
        torch.manual_seed(seed)
        seeded = run_seed_argument(mode, seed)
        with Timer(prompt.device) as timer:
            spec = make() if fresh else kept
            out = spec.generate(prompt[0], max_new_tokens=max_new_tokens, do_sample=mode.do_sample,
                                temperature=mode.temperature, top_p=mode.top_p, eos_token_id=eos_token_id, **options,
                                **seeded)
        return Run.from_stats(out.stats, timer.seconds, out.sequences[0, prompt.shape[1]:].tolist())

    return Method(name, "selfspec", run, drafter, num_draft_tokens, parameters(extra)[0], kept)


class RandomDrafter:
    """Uniformly random draft tokens (point masses): drafts that are almost never right, whatever the prompt. The
    useless-drafts check runs it through the public drafter interface, like any user's drafter."""

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def propose(self, context: DraftContext) -> Draft:
        tokens = torch.randint(0, self.vocab_size, (context.num_draft_tokens,), generator=self.generator)
        return Draft(tokens.to(context.token_ids.device))

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass


def random_heads(model, like=None, seed: int = 0):
    """Untrained Medusa heads shaped like `like` (default: 4 heads, 1 layer, shared LM head) with large random block
    weights, so their drafts are almost never right."""
    from heads import MedusaHeads

    config = like.config if like is not None else None
    shape = (config.num_heads, config.num_layers, config.share_lm_head) if config is not None else (4, 1, True)
    # the blocks (and own LM projections) are randomized; a shared LM head is not among their parameters
    return randomized(MedusaHeads.for_model(model, *shape), seed)


def randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`module` with every parameter drawn at random, large (4 / sqrt(fan-in)), in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 4 / p.shape[-1] ** 0.5)
    return module.eval()


def random_eagle_head(model, seed: int = 0):
    """An untrained EAGLE head for `model` (full vocabulary) with large random weights, so its drafts are almost
    never right: the useless case of the drafter whose default drafts are trees."""
    from heads.eagle import EagleHead

    return randomized(EagleHead.for_model(model), seed)


class Timer:
    """Wall clock around a call, with the device synchronised at both ends."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds = 0.0

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self._started
