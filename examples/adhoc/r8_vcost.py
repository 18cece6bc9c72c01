import time, torch, statistics
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.loading import load_model
from selfspec.target import TargetModel
model = load_model("smollm2"); target = TargetModel(model)
cache = target.new_cache()
ids = torch.arange(300) % 1000 + 100
with torch.inference_mode():
    target.forward(ids[:250], cache)
    res = {k: [] for k in range(8)}
    for r in range(6):
        for k in range(8):
            t = time.perf_counter(); h = target.forward(ids[250:251 + k], cache); target.logits(h); res[k].append(time.perf_counter() - t)
            cache.rollback(250)
base = min(res[0])
print("verify k -> min seconds / k=0:", [round(min(v) / base, 3) for k, v in res.items()], f"decode {base*1000:.1f} ms")
print("median ratio:", [round(statistics.median(v) / statistics.median(res[0]), 3) for k, v in res.items()])
