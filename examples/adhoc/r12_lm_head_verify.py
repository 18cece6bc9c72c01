"""Round 12 (AMD EPYC, one thread): what SmolLM2's verify forward over 1 + k tokens would cost, in one-token decodes
(decoder + LM head through F.linear), if its LM head ran through oneDNN on weights prepacked for 1 + k rows
(`torch.ops.mkldnn._reorder_linear_weight`), and whether the argmax tokens agree. A measurement for the next round's
decision, not library code. One run (15 reps, medians): verifying 0 / 1 / 2 / 3 / 4 drafts cost 0.92 / 1.56 / 2.02 /
1.95 / 1.93 decodes with F.linear's head, 0.88 / 1.47 / 1.76 / 1.63 / 2.02 with the prepacked oneDNN head; argmax
agreed everywhere. The decoder's own products carry most of the jump at 2 rows, so the head alone is no fix. Usage: python examples/adhoc/r12_lm_head_verify.py [REPS]"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
from selfspec.loading import load_model  # noqa: E402
from selfspec.target import TargetModel  # noqa: E402

model = load_model("smollm2")
target = TargetModel(model)
weight = target.lm_head.weight.detach()
packed = {m: torch.ops.mkldnn._reorder_linear_weight(weight, m) for m in range(1, 6)}
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
prompt = torch.arange(200) % 1000 + 100


def timed(num_tokens, onednn):
    cache = target.new_cache()
    target.forward(prompt, cache)
    ids = torch.arange(num_tokens) + 7
    times, agree = [], True
    for _ in range(reps):
        started = time.perf_counter()
        hidden = target.forward(ids, cache)
        logits = (torch.ops.mkldnn._linear_pointwise(hidden, packed[num_tokens], None, "none", [], "") if onednn
                  else F.linear(hidden, weight))
        times.append(time.perf_counter() - started)
        agree &= bool((logits.argmax(-1) == F.linear(hidden, weight).argmax(-1)).all())
        cache.rollback(prompt.shape[0])
    return statistics.median(times), agree


with torch.inference_mode():
    decode, _ = timed(1, False)
    for n in range(1, 6):
        mkl, _ = timed(n, False)
        dnn, agree = timed(n, True)
        print(f"verify {n - 1} drafts: F.linear head {mkl / decode:.2f} decodes, prepacked oneDNN head {dnn / decode:.2f} "
              f"(argmax agrees: {agree})")
