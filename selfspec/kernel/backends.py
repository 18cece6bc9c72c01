"""Which backend a kept-blocks layer multiplies with: "float" (the default: weights widened to float32, the
dequantized layer's function), "int8" (`int8.py`, llama.cpp's method) or "auto" (int8 where `chosen_backend`
measured it clearly faster on this machine, once, kept in the selfspec cache directory). Knows timings and the
setting; nothing about models beyond `use_backend`."""
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
    "float"); "auto" is `chosen_backend(qtype)`."""
    setting = setting if setting is not None else os.environ.get(BACKEND_ENV) or "float"
    if setting not in BACKENDS:
        raise ValueError(f"quantized backend {setting!r} (argument or ${BACKEND_ENV}): expected one of {BACKENDS}")
    from selfspec.kernel.quantized import type_id  # (quantized.py imports this module)

    return chosen_backend(type_id(qtype)) if setting == "auto" else setting


@lru_cache(maxsize=None)
def chosen_backend(qtype: int) -> str:
    """The faster backend for weights of GGUF type `qtype` on this machine, measured once (`measure_backends`) and
    kept in the selfspec cache directory per kernel build and thread count: "int8" where one row costs at most
    INT8_GAIN of the float path's time and MAX_ROWS rows no more, else "float"."""
    key = f"{few_row_linear.kernel_version()}-{torch.get_num_threads()}threads"
    path = cache_dir() / "quantized" / f"backends-{key}.json"
    try:
        known = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        known = {}
    from selfspec.kernel.quantized import TYPES

    name = next(name for name, code in TYPES.items() if code == qtype)
    if name not in known:
        times = measure_backends(qtype)
        faster = (times["int8"][1] <= INT8_GAIN * times["float"][1]
                  and times["int8"][MAX_ROWS] <= times["float"][MAX_ROWS])
        known[name] = {"backend": "int8" if faster else "float", "ms": times}
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
    streamed from memory as a decode streams a model's layers), 1 and MAX_ROWS rows, through each backend: {"float":
    {1: ms, MAX_ROWS: ms}, "int8": {...}}. Passes interleaved, after one warm-up pass each."""
    from selfspec.kernel.quantized import _entry_points, random_weight

    weights = [random_weight(qtype, *shape, seed=i) for i in range(layers)]
    interleaved = [random_weight(qtype, *shape, seed=i) for i in range(layers)]
    for weight in interleaved:
        weight.set_interleaved(True)
    linear = _entry_points()[0]
    times = {"float": {}, "int8": {}}
    for rows in (1, MAX_ROWS):
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


def use_backend(model: torch.nn.Module, backend: str | None) -> None:
    """Set the backend of every QuantizedLinear of `model` (resolved as the constructor's `backend` argument)."""
    from selfspec.kernel.quantized import QuantizedLinear

    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.backend = resolve_backend(backend, module.weight.qtype)
