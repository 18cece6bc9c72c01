"""The benchmark's contestants: one decoding method each (transformers' `generate` variants, selfspec's drafters),
all run the same way on one prompt and measured the same way. Knows nothing about schedules or reports.

Every method's run is timed from outside (wall clock around the call, device synchronised), so transformers and
selfspec pay for the same things. Target forwards of transformers' methods are counted with a forward pre-hook on
the target model; from each forward's input length and cache length the hook also recovers how many drafts each
verification step proposed and accepted (see `_steps_from_calls`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from selfspec.drafters.base import Draft, DraftContext
from selfspec.engine import SelfSpecModel


@dataclass(frozen=True)
class Mode:
    """A decoding mode, identical for every method (transformers gets top_k=0: no implicit top-k in any version)."""

    name: str
    do_sample: bool
    temperature: float = 1.0
    top_p: float | None = None


MODES = (
    Mode("greedy", False),
    Mode("sample t=1.0", True, 1.0),
    Mode("sample t=0.7 top-p=0.9", True, 0.7, 0.9),
)


@dataclass
class Run:
    """One generation of one method on one prompt."""

    new_tokens: int
    seconds: float  # wall clock of the whole call: prefill + decode (+ drafting)
    token_ids: list[int]  # the new tokens (greedy runs are compared with plain generate's)
    target_forwards: int | None  # None: not countable
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    kv_bytes: int = 0  # KV cache(s) this run held at its longest (see `Method.memory_note`)
    peak_device_bytes: int | None = None  # CUDA only: peak allocated above what was allocated before the call


@dataclass(frozen=True)
class Method:
    name: str  # e.g. "selfspec medusa k=3"
    family: str  # "transformers" or "selfspec"
    run: Callable[[torch.Tensor, Mode, int], Run]  # ([1, T] prompt, mode, seed) -> Run
    drafter: str = "none"  # what drafts: "none", "medusa", "ngram", "early_exit", "prompt_lookup", "draft_model"
    num_draft_tokens: int | str | None = None
    extra_parameters: int = 0  # parameters beyond the target model's (heads, adapter, draft model)
    extra_parameter_bytes: int = 0


def parameter_count(module) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def parameter_bytes(module) -> int:
    return 0 if module is None else sum(p.numel() * p.element_size() for p in module.parameters())


def kv_bytes_per_token(model, num_layers: int | None = None) -> int:
    """Keys + values of one token in `num_layers` layers (default all) of a Llama-like decoder, in the model's dtype."""
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    return 2 * (num_layers or config.num_hidden_layers) * kv_heads * head_dim * element


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


def _steps_from_calls(calls, prompt_len: int, final_len: int) -> list[tuple[int, int]] | None:
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
        if not 0 <= accepted <= max(drafted, 0) or drafted < 0:
            return None
        steps.append((drafted, accepted))
    return steps


def _by_position(steps) -> tuple[list[int], list[int]]:
    drafted, accepted = [], []
    for num_drafted, num_accepted in steps:
        for counts in (drafted, accepted):
            counts.extend([0] * (num_drafted - len(counts)))
        for i in range(num_drafted):
            drafted[i] += 1
            accepted[i] += int(i < num_accepted)
    return drafted, accepted


def transformers_method(
    name: str, model, max_new_tokens: int, eos_token_id, drafter: str = "none", num_draft_tokens=None,
    assistant_kv_per_token: int = 0, extra=None, **assist,
) -> Method:
    """`model.generate` with `assist` (prompt_lookup_num_tokens=, assistant_early_exit=, assistant_model=)."""
    counter = ForwardCounter(model)
    kv_per_token = kv_bytes_per_token(model) + assistant_kv_per_token

    def run(prompt: torch.Tensor, mode: Mode, seed: int) -> Run:
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=mode.do_sample, eos_token_id=eos_token_id,
                      pad_token_id=eos_token_id, attention_mask=torch.ones_like(prompt))
        if mode.do_sample:
            kwargs.update(temperature=mode.temperature, top_p=mode.top_p, top_k=0)
            torch.manual_seed(seed)
        with counter, _Timer(prompt.device) as timer:
            sequences = model.generate(prompt, **kwargs, **assist)
        new = sequences[0, prompt.shape[1]:].tolist()
        steps = _steps_from_calls(counter.calls, prompt.shape[1], sequences.shape[1])
        drafted, accepted = _by_position(steps) if steps is not None and drafter != "none" else ([], [])
        return Run(len(new), timer.seconds, new, len(counter.calls), drafted, accepted,
                   kv_bytes=kv_per_token * sequences.shape[1], peak_device_bytes=timer.peak_bytes)

    return Method(name, "transformers", run, drafter, num_draft_tokens,
                  parameter_count(extra), parameter_bytes(extra))


# -- selfspec -----------------------------------------------------------------------------------------------------


def selfspec_method(name: str, spec: SelfSpecModel, max_new_tokens: int, eos_token_id, num_draft_tokens,
                    drafter: str, extra=None) -> Method:
    """`spec.generate` with a fixed num_draft_tokens (or "auto"); the drafter is spec's."""

    def run(prompt: torch.Tensor, mode: Mode, seed: int) -> Run:
        with _Timer(prompt.device) as timer:
            out = spec.generate(
                prompt[0], max_new_tokens=max_new_tokens, do_sample=mode.do_sample, temperature=mode.temperature,
                top_p=mode.top_p, num_draft_tokens=num_draft_tokens, seed=seed, eos_token_id=eos_token_id,
            )
        stats = out.stats
        return Run(stats.new_tokens, timer.seconds, out.sequences[0, prompt.shape[1]:].tolist(), stats.target_forwards,
                   list(stats.drafted_by_position), list(stats.accepted_by_position),
                   kv_bytes=stats.peak_cache_bytes, peak_device_bytes=timer.peak_bytes)

    return Method(name, "selfspec", run, drafter, num_draft_tokens, parameter_count(extra), parameter_bytes(extra))


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


class _Timer:
    """Wall clock around a call, with the device synchronised at both ends; on CUDA also the peak allocation."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds = 0.0
        self.peak_bytes = None

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._allocated = torch.cuda.memory_allocated()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self._started
        if self.cuda:
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._allocated
