"""Round 31 (an AMD EPYC with AVX-512, one thread): does SmolLM2's one-token decode run faster through selfspec's
few-row kernel than through F.linear on this CPU? The engine routes only 2-32-row products through the kernel (plain
decoding stays on F.linear), so where the kernel beats F.linear at one row, a verify forward over 2-9 rows costs less
than a plain decode, and part of a speedup over `generate` is the kernel's, not drafting's. Times a forward over
1 / 2 / 5 / 9 new tokens after a 256-token prefix: F.linear, the kernel as the engine routes it (2-32 rows), and the
kernel for one row too; medians of interleaved repeats, in one-token F.linear decodes.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r31_one_row_kernel.py [REPEATS]"""
import statistics
import sys
import time

import torch
import transformers

import selfspec.few_row_linear as frl
from harness import smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer, _ = smollm2_chat(1, 16)
repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 30
prefix = torch.randint(100, 20000, (1, 256))
cache = transformers.DynamicCache(config=model.config)
with torch.inference_mode():
    model(prefix, cache=cache, use_cache=True)
routes = {"F.linear": None, "kernel 2-32 rows": frl.FewRowLinears(model)}
frl.MIN_ROWS = 1
routes["kernel 1-32 rows"] = frl.FewRowLinears(model)
frl.MIN_ROWS = 2


def forward(rows: int) -> float:
    ids = torch.randint(100, 20000, (1, rows))
    positions = torch.arange(256, 256 + rows)[None]
    started = time.perf_counter()
    with torch.inference_mode():
        model(ids, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=rows)
    seconds = time.perf_counter() - started
    cache.crop(-rows)
    return seconds


times = {(name, rows): [] for name in routes for rows in (1, 2, 5, 9)}
for _ in range(repeats):
    for (name, rows), out in times.items():
        route = routes[name]
        if route is None:
            out.append(forward(rows))
        else:
            with route:
                out.append(forward(rows))
decode = statistics.median(times["F.linear", 1])
print(f"one-token decode through F.linear: {decode * 1e3:.1f} ms (median of {repeats})")
for name in routes:
    print(f"{name:17s} " + "  ".join(f"{rows} rows {statistics.median(times[name, rows]) / decode:.2f}"
                                     for rows in (1, 2, 5, 9)))
