"""Round 33 (the AMD EPYC, 2 vCPUs): SmolLM2 forwards over 1, 2, 3, 5 and 11 new tokens after a held-out chat
prompt, every product through the few-row kernel (one-row ones too), relative to the one-token forward, on one and
two torch threads alternately (5 timed rounds after a warm-up, medians): what a verify forward costs in decodes when
the kernel splits its products between threads.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r33_verify_rows_threads.py"""
import statistics
import time

import torch
import transformers

from selfspec.few_row_linear import FewRowLinears
from harness import smollm2_chat  # examples/adhoc/harness.py

transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(1, 64)
routes = FewRowLinears(model)
routes.route_one_row(True)
with torch.inference_mode():
    cache = model(prompts[0], use_cache=True).past_key_values
    for threads in (1, 2, 1, 2):
        torch.set_num_threads(threads)
        times = {k: [] for k in (1, 2, 3, 5, 11)}
        for round_ in range(6):
            for k in times:
                x = torch.randint(100, 1000, (1, k))
                with routes:
                    started = time.perf_counter()
                    model(x, past_key_values=cache, use_cache=True)
                    seconds = time.perf_counter() - started
                cache.crop(-k)
                if round_:
                    times[k].append(seconds)
        one = statistics.median(times[1])
        print(f"{threads} thread(s): one token {one * 1e3:.1f} ms; relative: "
              + " ".join(f"{k} tokens {statistics.median(v) / one:.2f}" for k, v in times.items()))
