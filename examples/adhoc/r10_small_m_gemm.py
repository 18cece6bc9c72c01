"""Why drafting hardly pays on some CPUs: what a float32 matrix product over M rows costs against one row (64 MB of
weights, out of cache as a model's are), and SmolLM2's own verify-cost curve (forwards of 1 + k tokens against 1).
Round 10 on an AMD EPYC (2 vCPUs, AVX2), torch 2.13.0 CPU wheel (MKL 2024.2), one thread: M = 2 cost 2.0x M = 1,
M = 4 3.8x, and SmolLM2 verifying 1 draft 1.8x a decode, where the Intel Xeon of rounds 1-9 measured 1.10.
Usage: python examples/adhoc/r10_small_m_gemm.py [smollm2]"""
import sys
import time

import torch

torch.set_num_threads(1)
torch.manual_seed(0)
W = torch.randn(8192, 2048)


def ms(m, reps=40):
    x = torch.randn(m, W.shape[1])
    for _ in range(5):
        torch.nn.functional.linear(x, W)
    started = time.perf_counter()
    for _ in range(reps):
        torch.nn.functional.linear(x, W)
    return (time.perf_counter() - started) / reps * 1e3


one = ms(1)
print(f"linear over 1 row: {one:.2f} ms ({W.numel() * 4 / one / 1e6:.1f} GB/s); M rows / 1 row:",
      " ".join(f"M={m} {ms(m) / one:.2f}x" for m in (2, 3, 4, 8, 16)))
if sys.argv[1:] == ["smollm2"]:
    import transformers
    transformers.logging.set_verbosity_error()
    from selfspec.loading import load_model
    from selfspec.target import TargetModel
    from selfspec.verify_cost import measure_verify_cost
    curve = measure_verify_cost(TargetModel(load_model("smollm2")), max_draft_tokens=6)
    print("SmolLM2 verify cost, k = 0..6 drafts:", " ".join(f"{c:.2f}" for c in curve.relative),
          f"(decode {curve.decode_seconds * 1e3:.1f} ms)")
