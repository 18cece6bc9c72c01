"""Round 13 (AMD EPYC, AVX2, one thread): F.linear (MKL) against selfspec's few-row kernel (selfspec/few_row_linear.py)
over M rows for SmolLM2's weight shapes (about 96 MB of copies cycled, so weights come from memory), in units of
F.linear over one row; then SmolLM2's verify forward over 1 + k tokens (decoder and LM head) with the model's linears
through F.linear and through the kernel (FewRowLinears, as the engine runs them), in one-token decodes, with the
argmax agreement and largest logit difference. Usage: python examples/adhoc/r13_few_row_kernel.py [REPS]"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
from selfspec.few_row_linear import FewRowLinears, few_row_linear  # noqa: E402
from selfspec.loading import load_model  # noqa: E402
from selfspec.target import TargetModel  # noqa: E402

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 11


def best_of(f, calls):
    f()
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


for out_f, in_f in [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]:
    weights = [torch.randn(out_f, in_f) for _ in range(max(1, int(96e6 // (out_f * in_f * 4))))]
    x1 = torch.randn(1, in_f)
    one = best_of(lambda: [F.linear(x1, w) for w in weights], 3)
    row = []
    for m in (1, 2, 3, 4, 8, 16):
        x = torch.randn(m, in_f)
        blas = best_of(lambda: [F.linear(x, w) for w in weights], 3) / one
        kernel = best_of(lambda: [few_row_linear(x, w) for w in weights], 3) / one
        row.append(f"M={m} {blas:.2f} / {kernel:.2f}")
    print(f"{out_f}x{in_f} (F.linear / kernel):", " | ".join(row), flush=True)

model = load_model("smollm2")
target = TargetModel(model)
routed = FewRowLinears(model)
prompt = torch.arange(200) % 1000 + 100


def timed(num_tokens, kernel):
    cache = target.new_cache()
    target.forward(prompt, cache)
    ids = torch.arange(num_tokens) + 7
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        if kernel:
            with routed:
                logits = target.logits(target.forward(ids, cache))
        else:
            logits = target.logits(target.forward(ids, cache))
        times.append(time.perf_counter() - started)
        cache.rollback(prompt.shape[0])
    return statistics.median(times), logits


with torch.inference_mode():
    decode, _ = timed(1, False)
    for n in (2, 3, 4, 5, 7, 9, 13, 17):
        blas, a = timed(n, False)
        kernel, b = timed(n, True)
        print(f"verify {n - 1:2d} drafts: F.linear {blas / decode:.2f} decodes, kernel {kernel / decode:.2f}; argmax "
              f"agrees {bool((a.argmax(-1) == b.argmax(-1)).all())}, largest logit difference "
              f"{(a - b).abs().max().item():.1e}", flush=True)
