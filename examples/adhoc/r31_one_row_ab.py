"""Round 31 (an AMD EPYC with AVX-512, one thread): plain decoding's one-row products through the few-row kernel
(`FewRowLinears.route_one_row`, what the engine now chooses where `one_row_pays`) against F.linear (as before), for
speculation off and the shipped EAGLE head at its defaults, on SmolLM2 (held-out chat prompts) or the reference model
with its Medusa heads (code prompts), greedy, 128 / 96 tokens without EOS, paired and interleaved with plain generate.
Prints the paired median ratio of each variant to generate and the one-row variants to their F.linear twins.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r31_one_row_ab.py smollm2|reference ROUNDS"""
import statistics
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import REFERENCE, interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
which, rounds = sys.argv[1], int(sys.argv[2])
if which == "smollm2":
    model, tokenizer, prompts = smollm2_chat(2, 128)
    heads, max_new = "examples/smollm2/eagle", 128
else:
    from selfspec.bench.prompts import prompt_ids, prompt_texts
    from selfspec.loading import load_model, load_tokenizer

    model, tokenizer = load_model(REFERENCE), load_tokenizer(REFERENCE)
    kind, texts = prompt_texts(tokenizer, 4)
    prompts = prompt_ids(tokenizer, texts, kind, 8192, 96, "cpu")
    heads, max_new = "examples/reference/heads", 96
specs = {"off one-row": SelfSpecModel(model, drafter="none"), "off F.linear": SelfSpecModel(model, drafter="none"),
         "heads one-row": SelfSpecModel(model, heads=heads), "heads F.linear": SelfSpecModel(model, heads=heads)}
for name, spec in specs.items():
    spec.few_row_linears.route_one_row(name.endswith("one-row"))
print("kept choice (what the engine routes):", SelfSpecModel(model, drafter="none").few_row_linears.one_row)
kwargs = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=[])
variants = ["generate", *specs]


def run(name, prompt):
    return timed_call(model, tokenizer, specs.get(name), prompt, **kwargs)


for name in variants:
    run(name, prompts[0][:, -32:])
results = list(interleaved(variants, prompts, rounds, run))
for name in specs:
    to_generate = [r["generate"].seconds / r[name].seconds for r in results]
    twin = name.replace("one-row", "F.linear")
    to_twin = [r[twin].seconds / r[name].seconds for r in results]
    same = sum(r[name].new_tokens == r["generate"].new_tokens for r in results)
    low, high = min(to_generate), max(to_generate)
    line = f"{name:15s} vs generate {statistics.median(to_generate):.3f}x ({low:.2f}-{high:.2f})"
    if twin != name:
        line += f"  vs {twin} {statistics.median(to_twin):.3f}x ({min(to_twin):.2f}-{max(to_twin):.2f})"
    tokens_per_forward = statistics.mean(r[name].tokens_per_forward for r in results)
    print(f"{line}  tokens/forward {tokens_per_forward:.2f}  same as generate {same}/{len(results)}")
