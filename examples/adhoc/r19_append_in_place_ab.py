"""Round 19 (Intel Xeon with AVX-512, one thread): the reference model's batch of B code prompts, 96 tokens without
EOS, at num_draft_tokens 0, 1 and "auto", each with the cache layers appending in place (`selfspec/cache_layer.py`)
and with transformers' DynamicLayer (a copy of the cache per layer per step, what the engine used before round 19),
interleaved in a random order per round; prints each variant's median speed relative to k = 0 with DynamicLayer
and whether its rows equal that variant's.
Usage: python examples/adhoc/r19_append_in_place_ab.py B ROUNDS"""
import random
import statistics
import sys
import time

import torch
import transformers

import selfspec.batch_cache
import selfspec.cache
from harness import reference_batch  # (examples/adhoc/harness.py)

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
batch, rounds = int(sys.argv[1]), int(sys.argv[2])
spec, prompts = reference_batch(batch)
in_place = selfspec.cache.append_in_place


def use(layers_in_place: bool) -> None:
    chosen = in_place if layers_in_place else (lambda hf_cache: hf_cache)
    selfspec.cache.append_in_place = selfspec.batch_cache.append_in_place = chosen


variants = [(f"k={k} {'in place' if place else 'DynamicLayer'}", k, place) for k in (0, 1, "auto")
            for place in (False, True)]
seconds, rows = {name: [] for name, *_ in variants}, {}
for name, k, place in variants:  # warm-up
    use(place)
    spec.generate(prompts, num_draft_tokens=k, max_new_tokens=96, eos_token_id=[])
for round_ in range(rounds):
    for name, k, place in random.Random(round_).sample(variants, len(variants)):
        use(place)
        started = time.perf_counter()
        out = spec.generate(prompts, num_draft_tokens=k, max_new_tokens=96, eos_token_id=[])
        seconds[name].append(time.perf_counter() - started)
        rows.setdefault(name, []).append([s.tolist() for s in out.sequences])
base = statistics.median(seconds[variants[0][0]])
reference_rows = rows[variants[0][0]][0]
for name, *_ in variants:
    same = all(r == reference_rows for r in rows[name])
    print(f"{name:24s} {base / statistics.median(seconds[name]):.3f}x of k=0 DynamicLayer   rows equal: {same}")
