"""Round 24 (an Intel Xeon with AMX-BF16 and AVX512-BF16, one thread): does a bfloat16 SmolLM2 verify many tokens
for about the price of one here (torch's oneDNN runs bfloat16 matrix products on AMX tiles), and do trees then pay
against bfloat16 `generate`? selfspec's few-row kernel is float32 only, so a bfloat16 model on a CPU runs F.linear.

Part 1: a forward over 1, 2, 4, 8, 16, 32 new tokens after a 256-token cache (logits for every row, the cache cut
back after each), sizes interleaved per round, medians, for SmolLM2 in float32 through F.linear, in float32 through
the few-row kernel (the engine's routing) and in bfloat16 through F.linear; relative to each one's one-token forward,
and the one-token forward against float32's.
Part 2 (ROUNDS > 0): greedy SmolLM2 in bfloat16 with its EAGLE head: selfspec's defaults, a chain and trees of 10 and
24 nodes against bfloat16 `generate` (examples/adhoc/harness.py's summary).
Usage: python examples/adhoc/r24_bf16_amx.py REPEATS [ROUNDS NUM_PROMPTS MAX_NEW_TOKENS]"""
import contextlib
import statistics
import sys
import time

import torch
import transformers
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

from selfspec import SelfSpecModel
from selfspec.few_row_linear import FewRowLinears

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
repeats = int(sys.argv[1])
rounds, num_prompts, max_new_tokens = (int(a) for a in (sys.argv[2:5] if len(sys.argv) > 2 else (0, 3, 96)))
ROWS = (1, 2, 4, 8, 16, 32)
CONTEXT = 256

model, tokenizer, prompts = smollm2_chat(max(num_prompts, 1), max_new_tokens)
print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
      f"mkldnn bf16 supported: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")


@torch.inference_mode()
def row_costs(net, routing) -> dict[int, float]:
    """Median seconds of a forward over n new tokens after CONTEXT cached ones, per n in ROWS."""
    ids = torch.randint(0, net.config.vocab_size, (1, CONTEXT + max(ROWS)))
    cache = transformers.DynamicCache(config=net.config)
    net(ids[:, :CONTEXT], past_key_values=cache, use_cache=True)
    times = {n: [] for n in ROWS}
    with routing():
        for round_index in range(repeats + 1):  # the first round warms up
            for n in ROWS:
                start = time.perf_counter()
                net(ids[:, CONTEXT:CONTEXT + n], past_key_values=cache, use_cache=True)
                elapsed = time.perf_counter() - start
                cache.crop(-n)  # (transformers 5.24: a negative count of tokens to remove)
                if round_index:
                    times[n].append(elapsed)
    return {n: statistics.median(t) for n, t in times.items()}


if repeats:
    curves = {"float32, F.linear": row_costs(model, contextlib.nullcontext),
              "float32, few-row kernel": row_costs(model, lambda: FewRowLinears(model))}
    curves["bfloat16, F.linear"] = row_costs(model.to(torch.bfloat16), contextlib.nullcontext)
    one_row = curves["float32, F.linear"][1]
    print(f"forward over n new tokens after {CONTEXT} cached, {repeats} rounds, relative to its own one-token forward")
    print(f"{'':26s}" + "".join(f"{n:>7d}" for n in ROWS) + "   one token vs float32 F.linear")
    for name, curve in curves.items():
        print(f"{name:26s}" + "".join(f"{curve[n] / curve[1]:7.2f}" for n in ROWS) + f"   {curve[1] / one_row:.2f}")
if rounds:
    model.to(torch.bfloat16)  # (in place, as in part 1: nn.Module.to casts the module itself)
    specs = {name: SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_size=size)
             for name, size in (("defaults", "auto"), ("chain", None), ("tree 10", 10), ("tree 24", 24))}
    for name, spec in specs.items():
        print(f"{name}: tree_size {spec.tree_size}, chain_reason {spec.chain_reason!r}")
    greedy_against_generate(model, tokenizer, specs, prompts[:num_prompts], rounds, max_new_tokens)
