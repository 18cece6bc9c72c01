"""Time the wrap-time tree probe on SmolLM2 (check_tree_support with its per-model cache cleared), against a one-token
forward. Usage: python examples/adhoc/r22_probe_time.py [REPEATS]"""
import statistics, time, torch, sys
torch.set_num_threads(1)
from selfspec.loading import load_model
from selfspec.target import TargetModel
import selfspec.tree_forward as tf
model = load_model("smollm2")
target = TargetModel(model)
times = []
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 7):
    tf._TREE_PROBE_PASSED.clear()
    t = time.perf_counter(); tf.check_tree_support(target); times.append(time.perf_counter() - t)
ids = torch.arange(20)[None]
with torch.no_grad():
    model(ids)
    d = []
    for _ in range(20):
        t = time.perf_counter(); model(ids[:, :1]); d.append(time.perf_counter() - t)
print(f"probe median {statistics.median(times)*1000:.0f} ms (all {[round(x*1000) for x in times]}), one-token forward {statistics.median(d)*1000:.1f} ms")
