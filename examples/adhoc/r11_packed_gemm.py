"""MKL's packed GEMM (torch.ops.mkl._mkl_reorder_linear_weight / _mkl_linear, what inductor uses on CPUs) against
F.linear for SmolLM2's LM head shape (49152 x 576, out of cache), M = 1..8 rows, in units of F.linear over one row.
Round 11 on the AMD EPYC: packed 0.53 at M = 1 and 1.03 at M = 2 (F.linear 2.07): it speeds one-row decoding as much
as verification (two rows still cost ~2x one), so it would not make drafting pay here, and it needs a second copy of
the weights; not adopted. (The oneDNN column errs: wrong argument types, left.)
Usage: python examples/adhoc/r11_packed_gemm.py [N K]"""
import time, torch, sys
torch.set_num_threads(1); torch.manual_seed(0)
N, K = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (49152, 576)
copies = max(1, int(160e6 / (N * K * 4)))
Ws = [torch.randn(N, K) for _ in range(copies)]
def run(f, x, reps=None):
    reps = reps or max(copies, 10)
    for i in range(copies): f(x, i)
    best = 1e9
    for r in range(3):
        t = time.perf_counter()
        for i in range(reps): f(x, i % copies)
        best = min(best, (time.perf_counter() - t) / reps)
    return best * 1e6
lin = lambda x, i: torch.nn.functional.linear(x, Ws[i])
x1 = torch.randn(1, K)
b1 = run(lin, x1)
print(f"N={N} K={K} M=1 linear {b1:.0f}us")
for M in (1, 2, 3, 4, 5, 8):
    x = torch.randn(M, K)
    ref = torch.nn.functional.linear(x, Ws[0])
    row = [f"lin {run(lin, x)/b1:.2f}"]
    try:
        P = [torch.ops.mkl._mkl_reorder_linear_weight(W, M) for W in Ws]
        f = lambda x, i: torch.ops.mkl._mkl_linear(x, P[i], Ws[i], None, M)
        ok = torch.allclose(f(x, 0), ref, atol=1e-3)
        row.append(f"mkl_packed {run(f, x)/b1:.2f}{'' if ok else ' WRONG'}")
        del P
    except Exception as e:
        row.append(f"mkl_packed err {str(e)[:80]}")
    try:
        P = [torch.ops.mkldnn._reorder_linear_weight(W, [M, K]) for W in Ws]
        f = lambda x, i: torch.ops.mkldnn._linear_pointwise(x, P[i], None, "none", [], "")
        ok = torch.allclose(f(x, 0), ref, atol=1e-3)
        row.append(f"onednn_packed {run(f, x)/b1:.2f}{'' if ok else ' WRONG'}")
        del P
    except Exception as e:
        row.append(f"onednn err {str(e)[:120]}")
    print(f"M={M}", " | ".join(row), flush=True)
