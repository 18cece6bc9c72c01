"""How the engine's forwards run attention: what `transformers`' sdpa attention computes, through cheaper paths.

CUDA: every one of PyTorch's attention kernels but cuDNN's. Measured on an H200 (SmolLM2, bfloat16):
with cuDNN's scaled-dot-product attention allowed, a forward over several tokens with a mask cost 1.5-3.7 one-token
decodes where it costs 1.2-1.4 without it (EAGLE at a fixed k = 3: 0.72x of `generate` with it, 1.67x without), as if
a plan were built for every new (query length, cache length) pair: a decode step's cache is one step longer each time.
Plain one-token decoding was not slowed. The other kernels compute the same attention; only speed changes.

CPU: grouped key/value heads read in place. For a block of several query tokens with a mask (every verify forward:
a chain's causal block, a tree's ancestry, a batch's ragged rows), `transformers`' sdpa attention repeats each
key/value head for every query head it serves (`repeat_kv`: a copy of the layer's whole cache, every layer, every
step) before calling the kernel; PyTorch's kernel takes the grouped heads as they are (`enable_gqa`) and gives the
same result bit for bit (`tests/selfspec/test_attention_backends.py` checks it against `transformers`' own function).
Measured on an Intel Xeon with AVX-512 (SmolLM2: 9 query heads on 3 key/value heads; EAGLE head, greedy, 3 rounds x 3
held-out prompts, 96 tokens): the chain 1.47x -> 1.51x of `generate`,
a tree of 10 nodes 1.64x -> 1.75x, every run identical to `generate`. Every other call goes to the function it replaced.

CPU, products that round activations to int8 (`kernel/int8.py`): every forward after a prompt's prefill goes through
the kernel's attention in one fixed order (`kernel/attention.py`), whose result for a query does not depend on the
other queries beside it, so a verify forward, a batch's rows and a decode give each query the same bits and int8
rounding cannot turn PyTorch's ulp differences into different tokens. A prefill (`prompt_attention`) stays PyTorch's:
one prompt per forward, the same call whatever decodes it afterwards.

Both apply per resumption of the engine's decode generators, so the caller's code between two steps runs under its
own settings and its own attention functions. `additive_mask` gives every custom 4D mask (a tree's, a batch's, the
EAGLE head's) the form both attention paths take.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator

import torch
from packaging.version import Version
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

# Every backend but cuDNN's (and ERROR, which is not one).
_ALLOWED = [b for name, b in SDPBackend.__members__.items() if name not in ("CUDNN_ATTENTION", "ERROR")]
_KERNEL_TAKES_GROUPS = Version(torch.__version__.split("+")[0]) >= Version("2.5")  # (enable_gqa came in 2.5)


def additive_mask(attended: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = attended) -> the additive mask a custom 4D `attention_mask` is: 0 where attended,
    finfo(dtype).min elsewhere, in the model's dtype since eager attention adds it to the scores (sdpa takes the same).
    On `attended`'s device and of its shape."""
    mask = torch.zeros(attended.shape, dtype=dtype, device=attended.device)
    return mask.masked_fill_(~attended, torch.finfo(dtype).min)


def engine_attention(steps: Iterator, device, ordered: bool = False) -> Iterator:
    """Yield what `steps` yields, each resumption with the engine's attention paths for `device` (see the module);
    ordered: the model's products round activations, so decode and verify forwards take the ordered attention."""
    route = attention_route(device)
    context = ordered_in_kernel if ordered and route == "grouped kv in kernel" else _ROUTE_CONTEXTS.get(route)
    return steps if context is None else each_resumption(steps, context)


# Whether this thread's forwards take the ordered attention now (inside an ordered engine's resumption, not a prefill)
_ORDERED = contextvars.ContextVar("selfspec_ordered_attention", default=False)


def engine_attention_context(model) -> contextlib.AbstractContextManager:
    """For a check run outside the decode loop: the attention the engine's forwards of `model` take (ordered where its
    products round activations to int8), so the check sees what decoding will compute."""
    from selfspec.kernel.backends import rounds_activations

    return ordered_in_kernel() if rounds_activations(model) else contextlib.nullcontext()


def ordered_now() -> bool:
    """Whether this thread's forwards take the ordered attention now."""
    return _ORDERED.get()


@contextlib.contextmanager
def ordered_in_kernel():
    """`grouped_kv_in_kernel`, and forwards inside take the kernel's ordered attention where it applies."""
    token = _ORDERED.set(True)
    try:
        with grouped_kv_in_kernel():
            yield
    finally:
        _ORDERED.reset(token)


@contextlib.contextmanager
def prompt_attention():
    """A prompt's prefill inside: PyTorch's attention (one prompt per forward, whatever decodes it afterwards)."""
    token = _ORDERED.set(False)
    try:
        yield
    finally:
        _ORDERED.reset(token)


def attention_route(device) -> str:
    """Names the path `engine_attention` takes on `device` (a verify-cost curve learned on one is stale on another)."""
    device = torch.device(device)
    if device.type == "cuda":
        return "without cudnn"
    return "grouped kv in kernel" if device.type == "cpu" and _KERNEL_TAKES_GROUPS else "as transformers"


def each_resumption(steps: Iterator, context: Callable[[], contextlib.AbstractContextManager]) -> Iterator:
    """Yield what `steps` yields, running each resumption inside `with context()`."""
    while True:
        with context():
            try:
                item = next(steps)
            except StopIteration:
                return
        yield item


_lock = threading.Lock()
_installed = {"depth": 0, "ours": False}  # how many resumptions (any thread) are inside; whether we installed


@contextlib.contextmanager
def grouped_kv_in_kernel():
    """While inside, `transformers`' "sdpa" attention runs `grouped_kv_sdpa` in front of its own function, and leaves
    it as it was on leaving. Where a user registered another "sdpa" function, nothing is installed (theirs is theirs
    to compute). Counted, so overlapping resumptions (threads, one generator inside another's step) install it once
    and the last one out restores."""
    with _lock:
        if _installed["depth"] == 0 and ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = _grouped_kv_over_transformers
            _installed["ours"] = True
        _installed["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _installed["depth"] -= 1
            if _installed["depth"] == 0 and _installed["ours"]:
                _installed["ours"] = False
                del ALL_ATTENTION_FUNCTIONS["sdpa"]  # our local entry; under it, transformers' own again
                if ALL_ATTENTION_FUNCTIONS["sdpa"] is not sdpa_attention_forward:  # (it was a local entry before)
                    ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_attention_forward


def takes_ordered_attention(attention_function) -> bool:
    """Whether `attention_function` (what `transformers`' attention registry gives now) computes through the kernel's
    ordered attention where that applies: the engine's own function, inside an ordered resumption."""
    return attention_function is _grouped_kv_over_transformers and _ORDERED.get()


def _grouped_kv_over_transformers(*args, **kwargs):
    if _ORDERED.get():
        from selfspec.kernel.attention import ordered_sdpa

        result = ordered_sdpa(*args, **kwargs)
        if result is not None:
            return result
    return grouped_kv_sdpa(sdpa_attention_forward, *args, **kwargs)


def grouped_kv_sdpa(replaced: Callable, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """`transformers`' sdpa attention (query [B, heads, q, d], key / value [B, kv_heads, T, d]), with a masked block
    of several queries on CPU computed by the kernel over the grouped heads instead of after `repeat_kv`; everything
    else (one query, no mask, other devices, softcapping, position biases, attention weights asked) goes to
    `replaced`."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or attention_mask is None or query.shape[2] == 1 or not query.is_cpu
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
            or kwargs.get("output_attentions") or torch.jit.is_tracing() or torch.compiler.is_compiling()):
        return replaced(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    # (transformers' own path here: no causal flag with a mask; the kernel after repeat_kv)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous(), None


# What each route runs a resumption inside ("as transformers": nothing).
_ROUTE_CONTEXTS = {"without cudnn": lambda: sdpa_kernel(_ALLOWED), "grouped kv in kernel": grouped_kv_in_kernel}
