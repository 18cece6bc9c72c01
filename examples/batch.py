"""Several prompts decoded together: one target forward per step for every unfinished row, each row exactly what it
gives alone (greedy: its own greedy tokens; with a seed, row i sampled with seed + i).

    python examples/batch.py                                      # SmolLM2 with its shipped EAGLE head
    python examples/batch.py --model examples/reference/model --heads examples/reference/heads
"""
import argparse

from selfspec import SelfSpecModel

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--model", default="smollm2", help="smollm2, a .gguf file or a model directory")
parser.add_argument("--heads", default="examples/smollm2/eagle", help="an EAGLE head or Medusa heads directory")
parser.add_argument("--max-new-tokens", type=int, default=48)
args = parser.parse_args()

spec = SelfSpecModel.from_pretrained(args.model, heads=args.heads)
prompts = ["The three states of water are", "def read_lines(path):", "A good night's sleep", "import os\n"]

outs = spec.generate(prompts, max_new_tokens=args.max_new_tokens)
for prompt, text, stats in zip(prompts, outs.text, outs.row_stats):
    print(f"--- {prompt!r} ({stats.tokens_per_forward:.2f} tokens per forward)\n{text}")

# Each row is what it gives alone: check the first.
alone = spec.generate(prompts[0], max_new_tokens=args.max_new_tokens)
assert alone.sequences[0].tolist() == outs.sequences[0].tolist(), "a row differs from its prompt decoded alone"
print(f"batch: {outs.stats.new_tokens} tokens in {outs.stats.target_forwards} target forwards; row 0 identical alone")
