"""Round 12 (AMD EPYC, AVX2, MKL 2024.2, oneDNN 3.12), one thread: F.linear (MKL) against oneDNN's linear on
weights converted with to_mkldnn(), over M = 1, 2, 4, 8 rows, SmolLM2's shapes (64 MB of weights per call so they
come from memory). Measured (ms per product, MKL / oneDNN): LM head 49152x576 M=1 9.9 / 7.6, M=2 20.7 / 13.9, M=4
20.8 / 16.2, M=8 23.4 / 17.4; MLP 1536x576 M=1 0.31 / 0.26, M=2 0.50 / 0.50, M=8 0.59 / 0.65. Both jump at 2 rows
and are nearly flat from 2 to 8: verifying 1 draft costs ~1.6 decodes, 7 drafts ~2. oneDNN is faster on the LM head
at every M (plain decoding included), not a fix for the jump. Usage: python examples/adhoc/r12_onednn_linear.py"""
import time, torch
torch.set_num_threads(1)
import torch.nn.functional as F
def t(f, reps=30):
    for _ in range(3): f()
    s = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - s) / reps * 1e3
for out_f, in_f in [(1536, 576), (576, 1536), (49152, 576), (8192, 2048)]:
    # many copies so weights are out of cache like a model's
    n = max(1, int(64e6 // (out_f * in_f * 4)))
    Ws = [torch.randn(out_f, in_f) for _ in range(n)]
    Wd = [w.to_mkldnn() for w in Ws]
    row = []
    for m in (1, 2, 4, 8):
        x = torch.randn(m, in_f)
        a = t(lambda: [F.linear(x, w) for w in Ws]) / n
        xd = x.to_mkldnn()
        b = t(lambda: [torch._C._nn.mkldnn_linear(xd, w) for w in Wd]) / n
        row.append(f"M={m} mkl {a:.3f} onednn {b:.3f}")
    print(out_f, in_f, " | ".join(row))
