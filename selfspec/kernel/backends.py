"""Which backend a kept-blocks layer multiplies with: "auto" (the default: int8 where `chosen_backend` measured it
clearly faster on this machine, once, kept in the selfspec cache directory; else float), "float" (weights widened to
float32: the dequantized layer's function) or "int8" (`int8.py`, llama.cpp's method: activations rounded to int8 per
block of 32). Knows timings and the setting; nothing about models beyond `use_backend` and `describe`."""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from functools import lru_cache

import torch

from selfspec.cache_dir import cache_dir
from selfspec.kernel import few_row_linear
from selfspec.kernel.int8 import int8_linear

BACKENDS = ("auto", "float", "int8")
BACKEND_ENV = "SELFSPEC_QUANTIZED_BACKEND"
# "auto" takes int8 where one row costs at most this fraction of the float path's time and MAX_ROWS rows no more.
INT8_GAIN = 0.9
MAX_ROWS = few_row_linear.MAX_ROWS
logger = logging.getLogger(__name__)


def resolve_backend(setting: str | None, qtype: int | str) -> str:
    """"float" or "int8" for a layer of GGUF type `qtype`: setting None reads $SELFSPEC_QUANTIZED_BACKEND (default
    "auto"); "auto" is `chosen_backend(qtype)`."""
    setting = setting if setting is not None else backend_setting()
    if setting not in BACKENDS:
        raise ValueError(f"quantized backend {setting!r} (argument or ${BACKEND_ENV}): expected one of {BACKENDS}")
    from selfspec.kernel.quantized import type_id  # (quantized.py imports this module)

    return chosen_backend(type_id(qtype)) if setting == "auto" else setting


def backend_setting() -> str:
    """$SELFSPEC_QUANTIZED_BACKEND, or "auto" where it is unset."""
    return os.environ.get(BACKEND_ENV) or "auto"


def _measured_path():
    key = f"{few_row_linear.kernel_version()}-{torch.get_num_threads()}threads"
    return cache_dir() / "quantized" / f"backends-{key}.json"


def measured_choices() -> dict[str, dict]:
    """What "auto" measured on this machine at this thread count, per GGUF type name: {"Q4_1": {"backend": "int8",
    "ms": {"float": {"1": ms, "32": ms}, "int8": {...}}}} (empty before anything was measured)."""
    try:
        return json.loads(_measured_path().read_text())
    except (FileNotFoundError, ValueError):
        return {}


def describe(model: torch.nn.Module) -> str | None:
    """One line: the backend each GGUF type of `model`'s kept layers multiplies with, and where "auto" measured it, the
    timings it chose by (None for a model with no kept layers)."""
    from selfspec.kernel.quantized import QuantizedLinear

    used = {}
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            used.setdefault(module.weight.name, module.backend)
    if not used:
        return None
    known, parts = measured_choices(), []
    for name, backend in sorted(used.items()):
        ms = known.get(name, {}).get("ms")
        timing = "" if not ms else " (ms float / int8: " + ", ".join(
            f"{rows} row{'s' if rows != '1' else ''} {ms['float'][rows]} / {ms['int8'][rows]}"
            for rows in ms["int8"]) + ")"
        parts.append(f"{name} {backend}{timing}")
    return f"quantized products ({backend_setting()}): " + "; ".join(parts)


@lru_cache(maxsize=None)
def chosen_backend(qtype: int) -> str:
    """The faster backend for weights of GGUF type `qtype` on this machine, measured once (`measure_backends`) and
    kept in the selfspec cache directory per kernel build and thread count: "int8" where one row costs at most
    INT8_GAIN of the float path's time and MAX_ROWS rows no more, else "float"."""
    path, known = _measured_path(), measured_choices()
    from selfspec.kernel.quantized import TYPES

    name = next(name for name, code in TYPES.items() if code == qtype)
    if name not in known:
        times = measure_backends(qtype)
        faster = (times["int8"][1] <= INT8_GAIN * times["float"][1]
                  and times["int8"][MAX_ROWS] <= times["float"][MAX_ROWS])
        known[name] = {"backend": "int8" if faster else "float",
                       "ms": {backend: {str(rows): ms for rows, ms in by_rows.items()} for backend, by_rows in times.items()}}
        logger.info("selfspec: %s products, float path %s ms, int8 path %s ms (1 / %d rows): backend %s", name,
                    times["float"], times["int8"], MAX_ROWS, known[name]["backend"])
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f"{path.name}.{os.getpid()}")
        scratch.write_text(json.dumps(known, indent=1))
        os.replace(scratch, path)  # (atomic: a process reading it meanwhile sees the old file or the new)
    return known[name]["backend"]


def measure_backends(qtype: int, layers: int = 12, shape: tuple[int, int] = (2048, 2048), repeats: int = 5,
                     timer=time.perf_counter) -> dict[str, dict[int, float]]:
    """Median milliseconds of a pass through `layers` random weights of `shape` of GGUF type `qtype` (Q4_1: ~31 MB,
    streamed from memory as a decode streams a model's layers), 1, 4 and MAX_ROWS rows (a decode, a short chain's
    verify, a batch), through each backend: {"float": {1: ms, 4: ms, MAX_ROWS: ms}, "int8": {...}}. Passes
    interleaved, after one warm-up pass each."""
    from selfspec.kernel.quantized import _entry_points, random_weight

    weights = [random_weight(qtype, *shape, seed=i) for i in range(layers)]
    interleaved = [random_weight(qtype, *shape, seed=i) for i in range(layers)]
    for weight in interleaved:
        weight.set_interleaved(True)
    linear = _entry_points()[0]
    times = {"float": {}, "int8": {}}
    for rows in (1, 4, MAX_ROWS):
        x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
        out = torch.empty(rows, shape[0])
        passes = {"float": [], "int8": []}
        for _ in range(repeats + 1):
            for backend in passes:
                started = timer()
                for weight, grouped in zip(weights, interleaved):
                    if backend == "int8":
                        int8_linear(x, grouped)
                    else:
                        linear(qtype, x.data_ptr(), rows, shape[1], weight.blocks.data_ptr(), shape[0], out.data_ptr())
                passes[backend].append(timer() - started)
        for backend, seconds in passes.items():
            times[backend][rows] = round(1e3 * statistics.median(seconds[1:]), 3)
    return times


def rounds_activations(model: torch.nn.Module) -> bool:
    """Whether some product of `model` rounds its input to int8 (a kept layer on the int8 backend): there a float32
    difference of an ulp can move an output by a whole int8 step of its block."""
    from selfspec.kernel.quantized import QuantizedLinear

    return any(isinstance(m, QuantizedLinear) and m.backend == "int8" for m in model.modules())


def use_backend(model: torch.nn.Module, backend: str | None) -> None:
    """Set the backend of every QuantizedLinear of `model` (resolved as the constructor's `backend` argument)."""
    from selfspec.kernel.quantized import QuantizedLinear

    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.backend = resolve_backend(backend, module.weight.qtype)
