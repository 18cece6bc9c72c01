"""Round 23: time the wrap-time tree probe on SmolLM2 (check_tree_support with its per-model memo cleared) as the
engine runs it since round 23 (inside the few-row kernel's routing, the paths' plain forwards as one batch), and
without the routing, against a one-token forward. Usage: python examples/adhoc/r23_probe_time.py [REPEATS]"""
import contextlib
import statistics
import sys
import time

import torch

import selfspec.tree_forward as tf
from selfspec.few_row_linear import FewRowLinears
from selfspec.loading import load_model
from selfspec.target import TargetModel

torch.set_num_threads(1)
model = load_model("smollm2")
target = TargetModel(model)
repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
for name, routing in (("kernel routing (the engine's)", lambda: FewRowLinears(model)),
                      ("F.linear", contextlib.nullcontext)):
    times = []
    for _ in range(repeats):
        tf._TREE_PROBE_PASSED.clear()
        start = time.perf_counter()
        with routing():
            tf.check_tree_support(target)
        times.append(time.perf_counter() - start)
    everything = [round(x * 1000) for x in times]
    print(f"probe with {name}: median {statistics.median(times) * 1000:.0f} ms (all {everything})")
ids = torch.arange(20)[None]
with torch.no_grad():
    model(ids)
    decodes = []
    for _ in range(20):
        start = time.perf_counter()
        model(ids[:, :1])
        decodes.append(time.perf_counter() - start)
print(f"one-token forward {statistics.median(decodes) * 1000:.1f} ms")
