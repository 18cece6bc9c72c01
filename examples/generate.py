"""selfspec from Python: load a model with its drafting head, generate greedy (the model's own greedy tokens) and
sampled (the model's own distribution), stream, and read the statistics.

    python examples/generate.py                                   # SmolLM2 with its shipped EAGLE head
    python examples/generate.py --model examples/reference/model --heads examples/reference/heads --prompt "def main():"
"""
import argparse

from selfspec import SelfSpecModel

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--model", default="smollm2", help="smollm2, a .gguf file or a model directory")
parser.add_argument("--heads", default="examples/smollm2/eagle", help="an EAGLE head or Medusa heads directory")
parser.add_argument("--prompt", default=None, help="a plain prompt; default: a chat question (SmolLM2)")
parser.add_argument("--max-new-tokens", type=int, default=64)
args = parser.parse_args()

spec = SelfSpecModel.from_pretrained(args.model, heads=args.heads)
prompt = args.prompt or [{"role": "user", "content": "How do glaciers shape the landscape?"}]

# Greedy: exactly model.generate(do_sample=False), in fewer target forwards.
out = spec.generate(prompt, max_new_tokens=args.max_new_tokens)
print(out.text)
print(f"greedy: {out.stats.new_tokens} tokens in {out.stats.target_forwards} target forwards "
      f"({out.stats.tokens_per_forward:.2f} tokens per forward)")

# Sampled with a seed: the same tokens on every run, whatever the drafter; the law is the model's own.
out = spec.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=True, temperature=0.7, top_p=0.9, seed=0)
print(f"sampled (seed 0): {out.stats.tokens_per_forward:.2f} tokens per forward")

# Streaming: one piece per target forward, the same tokens generate returns.
for piece in spec.stream(prompt, max_new_tokens=args.max_new_tokens):
    print(piece.text, end="", flush=True)
print()
