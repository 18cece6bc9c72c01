"""Float32 linear layers over a few rows on x86 CPUs: a streaming kernel where BLAS's small-M GEMM is slow.

Verifying k drafts runs the target over 1 + k rows. On a GPU that costs about one decode; on some CPUs BLAS does
not: on an AMD EPYC with AVX2 (MKL 2024.2, one thread) F.linear over 2 rows cost 1.5-2.3x one row and was
nearly flat after, so SmolLM2 verified 1 draft for 1.4-1.6 decodes and 2-7 drafts for ~2 and no draft length paid.
A one-row product streams the weights once; so does this kernel for up to MAX_ROWS rows (each weight row is read
from memory once and multiplied by every row of x, slice by slice in L1, while the next weights stream in): over
2-8 rows it costs about one row's time, over 16 rows 1.1-1.8x, over 32 1.6-2.9x (F.linear: 1.8-2.9x, 2.2-3.5x,
2.7-5.3x; a microbenchmark of SmolLM2's
shapes; the kernel's own comment). It is C
(selfspec/kernel/few_row_linear.c), compiled on first use with the system's C compiler into the cache directory,
for AVX-512 where the CPU has it and AVX2 + FMA otherwise (an Intel Xeon: the AVX-512 build 0.8-0.9x of the
AVX2 build's time over 4-32 rows), and loaded with ctypes; where there is no compiler, no AVX2 or FMA, or no x86
CPU, everything runs through F.linear as before.

Threads: the kernel splits each product's weight rows between torch's threads (`torch.set_num_threads`; OpenMP, the
runtime torch's CPU build loaded, so no second pool of threads spins against torch's), four rows at a time, each
output computed by one thread with the same code: bitwise the same result on any number of threads. An AMD
EPYC with AVX-512 (2 vCPUs, SmolLM2, greedy, paired with `generate` on as many threads): on
two threads speculation off 2.22x of `generate` against 1.45x with one-threaded products, the EAGLE tree 3.11x
against 2.19x; on one thread unchanged (1.77x, 2.48x). F.linear's one-row products were no faster on two threads.

The engine routes the target's and the drafter's nn.Linear layers through it for the duration of each decode step
(`FewRowLinears.routing`, per resumption of the decode loop, as attention_backends does for CUDA's attention): a
layer's float32 CPU products over MIN_ROWS..MAX_ROWS rows are taken, and one-row products (plain decoding's
steps) too where the kernel measures clearly faster for them on this CPU (`one_row_pays`: SmolLM2's
one-token forward 0.71x of F.linear's time on an AMD EPYC with AVX-512, so there speculation off decodes ~1.4x as
fast as `generate`); everything else runs exactly as without it. (A TorchFunctionMode does the same without
touching the layers, but intercepting every op of a 30-layer forward cost SmolLM2 12 % of a decode.) Results agree
with F.linear to float32 rounding (a different summation order, as BLAS's GEMM and GEMV already differ); every row is
the same sum in the same order whatever the number of rows beside it.

A drafter's layers may stream their weights in bfloat16 (`draft_dtype`, on by default where the kernel runs): a
drafter's products are memory-bound like the model's (a tree level reads the head's layer and the draft vocabulary's
LM head rows for 1-4 rows), and its drafts need not match the model's arithmetic, only be what the verifier is told
they are. The kernel widens each bfloat16 weight to float32 as it loads it (the same float32 arithmetic on weights
rounded to bfloat16): half the bytes, on an AMD EPYC with AVX-512 0.55-0.65x of the float32 kernel's time over 1-4
rows of SmolLM2's head shapes, 0.8x over 10. The drafter's own parameters stay float32; the engine keeps a bfloat16
copy of each weight (made again if the weight changes). The model's layers are never routed this way.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from selfspec.attention_backends import each_resumption
from selfspec.kernel import int8 as int8_kernel  # (a module: int8.py imports this one)
from selfspec.cache_dir import cache_dir

# One row stays on BLAS (plain decoding unchanged). 32: what this CPU's batches and trees use (batch 8 at w <= 3,
# trees of up to 31 nodes), where the kernel was measured faster (an AMD EPYC with AVX2: still 0.6-0.8x of F.linear's
# time over 32-48 rows, so the bound is conservative here); a CPU with a faster small-M GEMM may catch up sooner.
MIN_ROWS, MAX_ROWS = 2, 32
# Plain decoding's one-row products go through the kernel too where it measures at most this fraction of F.linear's
# time (`one_row_pays`): a clear gain, not a coin toss between two equal paths on a noisy machine.
ONE_ROW_GAIN = 0.9
SOURCE = Path(__file__).parent / "few_row_linear.c"
# what the library is built from: SOURCE includes the others (one translation unit, one library)
SOURCES = (SOURCE, Path(__file__).parent / "llama_layer.c")
# -ffp-contract=off: the quantized paths compute a weight as a product, then a sum (d * q + m), each rounded as gguf's
# dequantizer does; the float32 paths' fused multiply-adds are written out as intrinsics, so they stay fused.
FLAGS = ["-O3", "-shared", "-fPIC", "-ffp-contract=off"]
# The kernel's vector instructions, by what torch reports the CPU has: AVX-512 where it is there (an Intel
# Xeon: 4-32 rows 0.8-0.9x of the AVX2 build's time, the same at 1-2 rows), else AVX2 + FMA.
# F16C for the GGUF blocks' half-precision scales (every AVX2 CPU has it).
ISA_FLAGS = {"avx512": ["-mavx512f", "-mavx2", "-mfma", "-mf16c"], "avx2": ["-mavx2", "-mfma", "-mf16c"]}
# Threads: the kernel splits each product's weight rows between torch's threads (torch.set_num_threads) through
# OpenMP, which then is the process's own runtime, the one torch's CPU build loaded and runs its parallel loops in
# (the same soname). An AMD EPYC with AVX-512 (2 vCPUs): one thread streams ~25-30 GB/s, two ~35-60 GB/s, while F.linear's
# one-row products were no faster on two threads. Where the compiler has no OpenMP, the kernel builds without it.
THREAD_FLAGS = ["-fopenmp"]
SETTINGS = ("auto", "on", "off")
DRAFT_DTYPES = ("auto", "bfloat16", "int8", "model", None)
logger = logging.getLogger(__name__)


def resolve_few_row_kernel(setting: str | bool, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on `device` in `dtype` runs its few-row products through the kernel. setting: "auto" (when
    the model is float32 on a CPU and the kernel builds here), "on" (the same, but an error says why it cannot),
    "off" (F.linear everywhere). True / False mean "on" / "off"."""
    setting = {True: "on", False: "off"}.get(setting, setting)
    if setting not in SETTINGS:
        raise ValueError(f"few_row_kernel={setting!r}: expected one of {SETTINGS} (or True / False)")
    if setting == "off":
        return False
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        why_not = f"the model is {dtype} on {torch.device(device).type}; the kernel is for float32 on a CPU"
    else:
        why_not = unavailable_reason()
    if why_not and setting == "on":
        raise ValueError(f"few_row_kernel='on' but {why_not}; pass few_row_kernel='auto' or 'off'")
    return why_not is None


def resolve_draft_dtype(setting, few_row_kernel: bool, int8_model: bool = False) -> torch.dtype | None:
    """The dtype a drafter's layers stream their weights in through the kernel: torch.bfloat16, torch.int8 (Q8_0
    blocks through the int8 kernel), or None (the model's own). setting: "auto" (int8 where `few_row_kernel` runs and
    the model's own products round activations to int8, `int8_model`; else bfloat16 where it runs; else None),
    "bfloat16" / torch.bfloat16 or "int8" / torch.int8 (the same, but an error says why it cannot), None / "model"
    (the model's own)."""
    setting = {torch.bfloat16: "bfloat16", torch.int8: "int8"}.get(setting, setting)
    if setting not in DRAFT_DTYPES:
        raise ValueError(f"draft_dtype={setting!r}: expected one of {DRAFT_DTYPES} (or torch.bfloat16 / torch.int8)")
    if setting in ("bfloat16", "int8") and not few_row_kernel:
        raise ValueError(f"draft_dtype='{setting}' streams the drafter's weights through selfspec's few-row kernel, "
                         "which does not run for this model (it needs a float32 model on an x86 CPU with AVX2 and a C "
                         "compiler, and few_row_kernel not 'off'); pass draft_dtype='auto' or None")
    if not few_row_kernel or setting in ("model", None):
        return None
    return torch.int8 if setting == "int8" or (setting == "auto" and int8_model) else torch.bfloat16


def kernel_isa() -> str | None:
    """The instruction set the kernel is built for here: "avx512", "avx2", or None (neither, or not x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return {"AVX512": "avx512", "AVX2": "avx2"}.get(torch.backends.cpu.get_cpu_capability())


@lru_cache(maxsize=1)
def kernel_version() -> str:
    """A digest of the kernel's source and instruction set: what a verify-cost curve learned with it depends on."""
    return hashlib.sha256(_source() + str(kernel_isa()).encode()).hexdigest()[:12]


def _source() -> bytes:
    """The text the library is built from (every file of SOURCES)."""
    return b"".join(path.read_bytes() for path in SOURCES)


def unavailable_reason() -> str | None:
    """None when the kernel is built and loaded here, else why not (no x86 CPU with AVX2, no C compiler, ...)."""
    return _load()[1]


def kernel_threads() -> int:
    """The most threads the kernel splits a product's weight rows between, called from this thread now: torch's
    thread count (`torch.get_num_threads()`) where it was built with OpenMP, 1 where it was built without (or is
    unavailable). A product takes fewer where each would get under `weights_per_thread()` weights (or four rows)."""
    library = _kernel_library()
    return 1 if library is None else library.few_row_linear_threads()


def weights_per_thread() -> int:
    """The fewest weights (rows x columns) each thread of a split product gets (the kernel's constant): a product of
    fewer than twice as many runs on one thread."""
    library = _kernel_library()
    return 0 if library is None else library.few_row_linear_weights_per_thread()


def _kernel_library() -> ctypes.CDLL | None:
    """The loaded kernel library of `kernel_isa()`'s build, or None where it is unavailable."""
    isa = kernel_isa()
    return None if isa is None or _load()[0] is None else _built_library(isa)[0]


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) through the kernel, for any number of rows: x [..., K] float32 on a CPU, weight
    [N, K] contiguous float32, or bfloat16 (F.linear(x, weight.float(), bias) to float32 rounding), K a multiple of 8,
    bias [N] float32 or None. Raises if the kernel is unavailable."""
    bfloat16 = weight.dtype is torch.bfloat16
    kernel, why_not = _load_bf16() if bfloat16 else _load()
    if kernel is None:
        raise RuntimeError(f"the few-row kernel is unavailable: {why_not}")
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1] or weight.shape[1] % 8:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need [..., K] and [N, K], K % 8 == 0")
    if not (_plain_float32(x) and _dense_parameters(weight, bias, weight.dtype if bfloat16 else torch.float32)):
        raise ValueError("the kernel takes plain float32 CPU tensors, a contiguous float32 or bfloat16 weight and a "
                         "contiguous bias of one value per output")
    return _run(kernel, x, weight, bias)


def _run(kernel, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows_in = x if x.is_contiguous() else x.contiguous()  # (a contiguous x is its rows, as they lie in memory)
    out = x.new_empty((*x.shape[:-1], weight.shape[0]))
    kernel(rows_in.data_ptr(), rows_in.numel() // weight.shape[1], weight.shape[1], weight.data_ptr(), weight.shape[0],
           None if bias is None else bias.data_ptr(), out.data_ptr())
    return out


class FewRowLinears:
    """The nn.Linear layers of some modules, routed through the kernel while inside `with` (or `routing(steps)`):
    each layer's forward takes its few-row float32 products and hands every other call to F.linear, as nn.Linear
    itself does. Outside, the layers are untouched nn.Linear modules. A layer whose forward someone else replaced
    (accelerate's offloading hooks, a user's patch), or whose input size is not a multiple of 8, is left alone.
    draft_modules: a drafter's modules, routed the same way, or with `draft_dtype` (torch.bfloat16 or torch.int8)
    through the kernel's bfloat16 weights, or Q8_0 blocks and the int8 kernel, for 1..MAX_ROWS rows (one row too: a
    drafter's one-row products are not plain decoding); a layer that
    is also one of `modules`' (a drafter sharing the model's LM head) is the model's and stays float32.
    `route_one_row(True)` routes the model's one-row products (plain decoding's steps) too, where `one_row_pays`."""

    def __init__(self, *modules: torch.nn.Module | None, draft_modules=(), draft_dtype: torch.dtype | None = None):
        kernel = _load()[0]  # (None: nothing to route)
        target_layers = _linear_layers(modules) if kernel is not None else []
        own = {id(layer) for layer in target_layers}
        draft_layers = [layer for layer in _linear_layers(draft_modules) if id(layer) not in own] if kernel else []
        half_kernel = _load_bf16()[0] if draft_dtype is not None and draft_layers else None
        self._kernel, self._target_layers = kernel, target_layers
        self._draft_forwards = [(layer, _forward_of(layer, half_kernel or kernel, bfloat16=half_kernel is not None,
                                                    int8=half_kernel is not None and _q8_0_draft(layer, draft_dtype)))
                                for layer in draft_layers]
        self.route_one_row(False)  # sets `forwards` and `one_row`
        # memory the copies of the draft layers' weights take once made (at their first routed product): Q8_0 blocks
        # (34 bytes a block of 32) or bfloat16
        self.draft_copy_bytes = sum(
            layer.weight.numel() * 34 // 32 if _q8_0_draft(layer, draft_dtype) else layer.weight.numel() * 2
            for layer in draft_layers) if half_kernel else 0

    def one_row_pays(self) -> bool:
        """Whether the model's one-row products run clearly faster through the kernel here (`one_row_pays`)."""
        return one_row_pays(self._target_layers, self._kernel)

    def route_one_row(self, one_row: bool) -> None:
        """Route the model's one-row products through the kernel too (True), or leave them to F.linear (False); call
        it outside `with` (the layers' forwards are installed on entry)."""
        min_rows = 1 if one_row else MIN_ROWS
        self.forwards = [(layer, _forward_of(layer, self._kernel, min_rows=min_rows)) for layer in self._target_layers]
        self.forwards += self._draft_forwards
        self.one_row = bool(one_row and self._target_layers)  # whether plain decoding's products go through it

    def __enter__(self):
        for layer, forward in self.forwards:
            layer.__dict__.setdefault("forward", forward)  # (an instance attribute shadows nn.Linear.forward)
        return self

    def __exit__(self, *exc):
        for layer, forward in self.forwards:
            if layer.__dict__.get("forward") is forward:
                del layer.__dict__["forward"]

    def routing(self, steps: Iterator) -> Iterator:
        """Yield what `steps` yields, running each resumption inside `with self` (so the caller's code between two
        steps sees plain nn.Linear layers)."""
        return each_resumption(steps, lambda: self)


def _linear_layers(modules) -> list[torch.nn.Linear]:
    """The plain nn.Linear layers of `modules` (None entries skipped) the kernel can take (input size % 8 == 0),
    each once. A layer whose weight is a tensor subclass (torchao's quantized weights, e.g. Int8Tensor, live inside
    plain nn.Linear modules) is left to its own forward, said once in a log line: the kernel reads plain float32
    weights, and the subclass's own F.linear is the function the model computes. (bitsandbytes' Linear8bitLt and
    Linear4bit are subclasses of nn.Linear, never taken: `type(layer) is torch.nn.Linear`.)"""
    layers, quantized = {}, {}
    for module in modules:
        if not isinstance(module, torch.nn.Module):
            continue
        for layer in module.modules():
            if type(layer) is not torch.nn.Linear or layer.in_features % 8:
                continue
            weight = layer._parameters.get("weight")
            if weight is not None and type(weight) not in (torch.Tensor, torch.nn.Parameter):
                quantized[id(layer)] = type(weight).__name__
            else:
                layers[id(layer)] = layer
    if quantized:
        _log_left_alone(len(quantized), tuple(sorted(set(quantized.values()))))
    return list(layers.values())


@lru_cache(maxsize=None)
def _log_left_alone(count: int, kinds: tuple[str, ...]) -> None:
    logger.info("selfspec: %d linear layers hold %s weights (a tensor subclass, e.g. torchao's quantized weights): "
                "the few-row kernel leaves them to their own forward (it reads plain float32 weights only)",
                count, "/".join(kinds))


def _q8_0_draft(layer: torch.nn.Linear, draft_dtype: torch.dtype | None) -> bool:
    """Whether a drafter's layer keeps its weight as Q8_0 blocks under `draft_dtype`: int8, and an input size that is
    a whole number of blocks of 32 (others stream bfloat16)."""
    return draft_dtype is torch.int8 and layer.in_features % 32 == 0


def _forward_of(layer: torch.nn.Linear, kernel, bfloat16: bool = False, min_rows: int = MIN_ROWS, int8: bool = False):
    """nn.Linear's forward for this layer, with its few-row products through the kernel. The weight is read at each
    call (accelerate's offloading hooks swap it in per forward; a layer converted in place, e.g. to half precision,
    falls back to F.linear). It runs ~200 times per forward of a 30-layer model, so it reads the parameters from the
    module's dict (nn.Module's attribute lookup cost ~1.5 us each on an AMD EPYC) and does not copy a contiguous
    input (the whole check and call ~20 us before, ~10-12 us now); a weight that is not a registered parameter
    (pruning replaces it by a plain attribute) goes through F.linear.
    bfloat16 (a drafter's layer, `kernel` the bfloat16-weight entry point): products over 1..MAX_ROWS rows (a
    drafter's one-row products are not plain decoding) with a bfloat16 copy of the weight, made at first use and
    again whenever the weight's storage or version changes; int8 (with bfloat16, for a layer `_q8_0_draft` takes): the
    copy is the weight rounded to Q8_0 blocks instead, multiplied through the int8 kernel (`int8.py`).
    min_rows: the fewest rows a float32 product it takes."""
    k_dim, min_rows, copy = layer.in_features, 1 if bfloat16 else min_rows, {}

    def forward(x: torch.Tensor) -> torch.Tensor:
        parameters = layer._parameters
        weight, bias = parameters.get("weight"), parameters.get("bias")
        if not min_rows <= x.numel() // k_dim <= MAX_ROWS or not _kernel_takes(layer, x, weight, bias):
            return F.linear(x, layer.weight, layer.bias)
        if bfloat16:
            key = (weight.data_ptr(), weight._version)
            if copy.get("key") != key:
                copy["key"], copy["weight"] = key, (_q8_0_copy(weight) if int8
                                                    else weight.detach().to(torch.bfloat16).contiguous())
            if int8:
                out = int8_kernel.int8_linear(x, copy["weight"])
                return out if bias is None else out + bias
            weight = copy["weight"]
        return _run(kernel, x, weight, bias)
    return forward


def _q8_0_copy(weight: torch.Tensor):
    """A float32 weight [N, K] (K % 32 == 0) rounded to Q8_0 blocks, interleaved for the int8 kernel."""
    from selfspec.kernel.quantized import TYPES, QuantizedWeight

    quantized = QuantizedWeight(int8_kernel.q8_0_blocks(weight.detach().float()), TYPES["Q8_0"], weight.shape[1])
    quantized.set_interleaved(True)
    return quantized


def one_row_pays(layers: list[torch.nn.Linear], kernel, repeats: int = 3, timer=time.perf_counter) -> bool:
    """Whether one-row products of these layers (a model's: what one decode step streams) run clearly faster through
    the kernel than through F.linear on this CPU: the median over `repeats` interleaved passes through every layer
    with one row (after a warm-up pass each) through the kernel at most ONE_ROW_GAIN of F.linear's. The model's own
    weights, all of them, so they stream from memory as in a decode (a few layers' weights stay in the CPU's caches,
    where an AMD EPYC timed SmolLM2's decoder layers alike through both). An AMD EPYC with AVX-512 (one
    thread): SmolLM2's decoder layers 0.64x of F.linear's time, its LM head 0.51x, its whole one-token forward 0.71x;
    on other CPUs the kernel over 2 rows already cost 1.04-1.06 decodes,
    about what one row costs through F.linear. Costs 2 * (repeats + 1) passes (SmolLM2 there: ~0.2 s), which the
    engine pays once per machine and model (`verify_cost.kept_one_row`)."""
    layers = [layer for layer in layers if _dense_parameters(layer.weight, layer.bias)]
    if kernel is None or not layers:
        return False
    rows = {layer.in_features: torch.ones(1, layer.in_features) for layer in layers}
    passes = {"kernel": [], "F.linear": []}
    with torch.inference_mode():
        for _ in range(repeats + 1):
            for name in passes:
                started = timer()
                for layer in layers:
                    x = rows[layer.in_features]
                    if name == "kernel":
                        _run(kernel, x, layer.weight, layer.bias)
                    else:
                        F.linear(x, layer.weight, layer.bias)
                passes[name].append(timer() - started)
    kernel_time, blas_time = (statistics.median(passes[name][1:]) for name in ("kernel", "F.linear"))
    return kernel_time <= ONE_ROW_GAIN * blas_time


def _kernel_takes(layer: torch.nn.Linear, x: torch.Tensor, weight, bias) -> bool:
    """Whether the kernel can run `layer`'s product with x (rows aside): float32 x of the layer's input size, its
    registered float32 parameters dense, and no gradient to record."""
    return (weight is not None and x.shape[-1] == layer.in_features and _plain_float32(x)
            and weight.shape == (layer.out_features, layer.in_features) and _dense_parameters(weight, bias)
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or bias is not None and bias.requires_grad)))


def _dense_parameters(weight: torch.Tensor, bias: torch.Tensor | None, weight_dtype=torch.float32) -> bool:
    """What the kernel reads from a layer: a plain contiguous weight of `weight_dtype` (float32, or bfloat16 for the
    kernel's other entry point), and a float32 contiguous bias (if any), one value per output (the kernel reads
    weight.shape[0] of them)."""
    return (_plain(weight, weight_dtype) and weight.is_contiguous()
            and (bias is None or _plain_float32(bias) and bias.is_contiguous() and bias.shape == weight.shape[:1]))


def _plain_float32(tensor: torch.Tensor) -> bool:
    """A plain float32 tensor in CPU memory (not meta, sparse, or a tensor subclass)."""
    return _plain(tensor, torch.float32)


def _plain(tensor: torch.Tensor, dtype: torch.dtype) -> bool:
    return (tensor.dtype is dtype and tensor.is_cpu and tensor.layout is torch.strided
            and type(tensor) in (torch.Tensor, torch.nn.Parameter))


@lru_cache(maxsize=None)
def _load(isa: str | None = None):
    """(the kernel as a ctypes function, None) or (None, why not); built once per source, flags and compiler. isa:
    "avx512" or "avx2" (tests and A/Bs build both where the CPU has AVX-512); None: `kernel_isa()`."""
    if isa is None and kernel_isa() is not None:
        return _load(kernel_isa())  # (one build, one library loaded, however it is asked for)
    return _entry_point("few_row_linear", isa)


@lru_cache(maxsize=None)
def _load_bf16(isa: str | None = None):
    """As `_load`, for the kernel's bfloat16-weight entry point (the same library)."""
    if isa is None and kernel_isa() is not None:
        return _load_bf16(kernel_isa())
    return _entry_point("few_row_linear_bf16", isa)


def _entry_point(name: str, isa: str | None):
    library, why_not = _built_library(isa)
    if library is None:
        return None, why_not
    kernel = getattr(library, name)
    kernel.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                       ctypes.c_void_p, ctypes.c_void_p]
    kernel.restype = None
    return kernel, None


@lru_cache(maxsize=None)
def _built_library(isa: str | None):
    """(the kernel's library built for `isa`, None) or (None, why not): with OpenMP where the compiler has it
    (THREAD_FLAGS), else without."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"the CPU is {platform.machine()}, not x86-64"
    if kernel_isa() is None:
        return None, f"this CPU lacks AVX2 / FMA (torch reports {torch.backends.cpu.get_cpu_capability()})"
    if isa not in ISA_FLAGS:
        raise ValueError(f"isa={isa!r}: expected one of {tuple(ISA_FLAGS)}")
    if isa == "avx512" and kernel_isa() != "avx512":
        return None, f"this CPU lacks AVX-512 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler found (install gcc, or set CC)"
    try:
        try:
            library = _build(compiler, [*ISA_FLAGS[isa], *THREAD_FLAGS])
        except (OSError, subprocess.SubprocessError) as error:  # (no OpenMP here: one thread per product)
            logger.info("selfspec: the few-row kernel did not build with OpenMP (%s); building it single-threaded",
                        error)
            library = _build(compiler, ISA_FLAGS[isa])
        library = _library(library)
        library.few_row_linear_threads.restype = ctypes.c_int
        library.few_row_linear_weights_per_thread.restype = ctypes.c_long
        return library, None
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("selfspec: the few-row kernel did not build (%s); using F.linear", error)
        return None, f"the kernel did not build with {compiler}: {error}"


@lru_cache(maxsize=None)
def _library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))


def _build(compiler: str, isa_flags: list[str]) -> Path:
    """The cached library for these flags, built (again) unless its checksum file vouches for it: a truncated .so
    (a full disk, an interrupted copy) kills the process that loads it with SIGBUS, in every later run too."""
    source, flags = _source(), [*FLAGS, *isa_flags]
    key = hashlib.sha256(source + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    library = cache_dir() / "kernels" / f"few_row_linear-{key}.so"
    checksum = library.with_name(library.name + ".sha256")
    failed = library.with_suffix(".failed")  # a build that failed here: not retried by every process (OpenMP missing)
    if _intact(library, checksum):
        return library
    if failed.exists():
        raise OSError(f"{failed.read_text().strip()} (as {compiler} failed before; remove {failed} to try again)")
    if library.exists():  # replaced below, not deleted first: a process building it now may be about to load it
        logger.warning("selfspec: the cached kernel %s has no checksum or does not match it (a truncated file?); "
                       "rebuilding it", library)
    library.parent.mkdir(parents=True, exist_ok=True)
    # a scratch directory of this process's own: builders running at once never write each other's files
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = Path(scratch) / library.name
        result = subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built), "-lm"], capture_output=True,
                                text=True, timeout=120)
        if result.returncode != 0:
            error = result.stderr.strip()[-500:] or f"{compiler} exited with {result.returncode}"
            (Path(scratch) / failed.name).write_text(error)
            os.replace(Path(scratch) / failed.name, failed)
            raise OSError(error)
        (Path(scratch) / checksum.name).write_text(_sha256(built))
        os.replace(built, library)  # atomic: a process loading it meanwhile sees the whole file or none
        os.replace(Path(scratch) / checksum.name, checksum)  # after the library: a checksum names a whole file
    return library


def _intact(library: Path, checksum: Path) -> bool:
    """Whether `library` is the file its checksum file (written after it) names."""
    try:
        return checksum.read_text().strip() == _sha256(library)
    except FileNotFoundError:
        return False


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
