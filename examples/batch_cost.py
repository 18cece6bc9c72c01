"""What a batched verify forward costs by its width: B rows of 1 + w tokens each, relative to the B x 1 forward, on
a ragged cache holding 120 committed tokens per row (the shape `selfspec.batch.decode` verifies). It bounds what
speculation can gain in a batch: a width pays only if the rows' expected tokens per step grow faster than this.

    OMP_NUM_THREADS=1 python examples/batch_cost.py --model smollm2 --batch-sizes 1,4,8,16

Prints one line per batch size: the B x 1 forward in ms, then each width's cost relative to it (the fastest of 3
timed rounds after one warm-up).
"""
from __future__ import annotations

import argparse
import time

import torch

from selfspec.batch.decode import _forward_block
from selfspec.batch.cache import RaggedCache
from selfspec.loading import load_model
from selfspec.target import TargetModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="examples/reference/model", help="a directory, a .gguf file or smollm2")
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    parser.add_argument("--max-width", type=int, default=4, help="draft tokens per row, 0 .. this")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    target = TargetModel(model)
    with torch.inference_mode():
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            cache = RaggedCache(model, batch, target.device)
            _forward_block(target, cache, torch.randint(100, 1000, (batch, 120)))
            cache.commit(torch.full((batch,), 120))
            fastest = {}
            for round_ in range(4):
                for width in range(args.max_width + 1):
                    block = torch.randint(100, 1000, (batch, 1 + width))
                    started = time.perf_counter()
                    hidden = _forward_block(target, cache, block)
                    target.logits(hidden.reshape(-1, hidden.shape[-1]))
                    seconds = time.perf_counter() - started
                    cache.commit(torch.ones(batch, dtype=torch.long))  # keep one token per row, as a step does
                    if round_:  # the first round warms up
                        fastest[width] = min(fastest.get(width, seconds), seconds)
            base = fastest[0]
            print(f"batch {batch:2d}: {1000 * base:6.1f} ms at w=0; "
                  + " ".join(f"w={w} {s / base:.2f}" for w, s in fastest.items() if w), flush=True)


if __name__ == "__main__":
    main()
