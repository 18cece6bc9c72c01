"""Round 12 (AMD EPYC, AVX2, one thread): does oneDNN's linear on PREPACKED weights (torch.ops.mkldnn
._reorder_linear_weight, the blocked layout its inner product wants, as inductor's mkldnn fusion uses) make a product
over 2-8 rows cost about what 1 row costs? Compared: F.linear (MKL), oneDNN on plain to_mkldnn() weights, oneDNN on
weights prepacked for M rows (and for 1 row, reused at every M); ms per product and each row count over F.linear at
M = 1. Measured once (10:05, a noisier moment: F.linear at M=1 took 15.4 ms on the LM head, 9.9 ms at 08:40), over F.linear
at M=1, MKL / oneDNN packed for M: LM head 49152x576 M=2 1.88x / 1.00x, M=4 2.29x / 1.06x, M=8 2.51x / 1.40x; MLP
1536x576 M=2 1.38x / 1.14x, M=8 1.42x / 1.31x; 576x1536 M=2 1.28x / 1.42x; 576x576 M=2 1.42x / 1.36x; same values as
F.linear (allclose 1e-4, not bitwise). A lead for the verify forward's LM head (2-4 rows at one row's cost), not for
the decoder's small products; it needs a weight copy packed per row count. Not adopted; one run, not repeated.
Usage: python examples/adhoc/r12_onednn_prepacked.py"""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)


def ms(f, reps=30):
    for _ in range(3):
        f()
    started = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - started) / reps * 1e3


for out_features, in_features in [(49152, 576), (1536, 576), (576, 1536), (576, 576)]:
    copies = max(1, int(64e6 // (out_features * in_features * 4)))  # 64 MB per call: weights come from memory
    weights = [torch.randn(out_features, in_features) for _ in range(copies)]
    one = ms(lambda: [F.linear(torch.randn(1, in_features), w) for w in weights]) / copies
    print(f"{out_features}x{in_features}: F.linear M=1 {one:.3f} ms")
    packed_for_1 = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
    for m in (1, 2, 4, 8):
        x = torch.randn(m, in_features)
        mkl = ms(lambda: [F.linear(x, w) for w in weights]) / copies
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, m) for w in weights]
        dnn = ms(lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in packed]) / copies
        dnn1 = ms(lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in packed_for_1]) / copies
        same = torch.allclose(torch.ops.mkldnn._linear_pointwise(x, packed[0], None, "none", [], ""),
                              F.linear(x, weights[0]), atol=1e-4)
        print(f"  M={m}: MKL {mkl / one:.2f}x, oneDNN packed for M {dnn / one:.2f}x, packed for 1 {dnn1 / one:.2f}x "
              f"(of F.linear M=1); same values: {same}")
