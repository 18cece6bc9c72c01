"""Round 28: early exit at SmolLM2's untrained layer 8 with the defaults ("auto"), one sequence, greedy, against
speculation off and plain generate, paired and interleaved (the benchmark's held-out chat prompts, no EOS). Prints
each call's drafts, accepted drafts, shadow probes and target forwards, then the paired median ratios.
Usage: OMP_NUM_THREADS=1 python examples/adhoc/r28_early_exit_trace.py ROUNDS MAX_NEW [NUM_PROMPTS]"""
import statistics
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

rounds, max_new = int(sys.argv[1]), int(sys.argv[2])
num_prompts = int(sys.argv[3]) if len(sys.argv) > 3 else 2
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
specs = {"generate": None, "off": SelfSpecModel(model, drafter="none"),
         "early exit 8": SelfSpecModel(model, drafter="early_exit", exit_layer=8)}
kwargs = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=[])


def run(name, prompt):
    return timed_call(model, tokenizer, specs[name], prompt, **kwargs)


for name in specs:
    run(name, prompts[0][:, -32:])  # warm-up
ratios = {"early exit 8 / off": [], "early exit 8 / generate": [], "off / generate": []}
for results in interleaved(list(specs), prompts, rounds, run):
    s = results["early exit 8"].stats
    print(f"early exit: drafted {s.drafted} accepted {s.accepted} probed {s.probed} forwards {s.target_forwards} "
          f"| seconds generate {results['generate'].seconds:.2f} off {results['off'].seconds:.2f} "
          f"early exit {results['early exit 8'].seconds:.2f}", flush=True)
    ratios["early exit 8 / off"].append(results["off"].seconds / results["early exit 8"].seconds)
    ratios["early exit 8 / generate"].append(results["generate"].seconds / results["early exit 8"].seconds)
    ratios["off / generate"].append(results["generate"].seconds / results["off"].seconds)
for name, values in ratios.items():
    print(f"{name}: median speed ratio {statistics.median(values):.3f} (pairs {min(values):.2f}-{max(values):.2f})")
