"""Where a batched step's time goes: cProfile of selfspec's batched generate on the benchmark's held-out prompts.

    OMP_NUM_THREADS=1 python examples/adhoc/r28_batch_profile.py MODEL HEADS|none BATCH MAX_NEW [K] [EXIT_LAYER]

K: num_draft_tokens (an int or auto; default auto). EXIT_LAYER: draft with early exit there instead of HEADS.
Prints the top functions by own time and by cumulative time of three calls after a warm-up call.
"""
import cProfile
import pstats
import sys

import torch

from selfspec import SelfSpecModel
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.loading import load_model, load_tokenizer

model_path, heads, batch, max_new = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
k = sys.argv[5] if len(sys.argv) > 5 else "auto"
k = k if k == "auto" else int(k)
exit_layer = int(sys.argv[6]) if len(sys.argv) > 6 else None
torch.set_num_threads(1)
model, tokenizer = load_model(model_path), load_tokenizer(model_path)
drafter = {} if exit_layer is None else {"drafter": "early_exit", "exit_layer": exit_layer}
spec = SelfSpecModel(model, heads=None if heads == "none" else heads, tokenizer=tokenizer, tree_size=None, **drafter)
kind, texts = prompt_texts(tokenizer, batch)
pool = prompt_ids(tokenizer, texts, kind, model.config.max_position_embeddings, max_new, "cpu")
prompts = [pool[i % len(pool)][0] for i in range(batch)]
eos = tokenizer.eos_token_id
spec.generate(prompts, max_new_tokens=max_new, num_draft_tokens=k, eos_token_id=eos)  # warm-up
profile = cProfile.Profile()
profile.enable()
for _ in range(3):
    out = spec.generate(prompts, max_new_tokens=max_new, num_draft_tokens=k, eos_token_id=eos)
profile.disable()
print(f"drafted {out.stats.drafted} accepted {out.stats.accepted} forwards {out.stats.target_forwards}")
stats = pstats.Stats(profile)
stats.sort_stats("tottime").print_stats(25)
stats.sort_stats("cumulative").print_stats(40)
