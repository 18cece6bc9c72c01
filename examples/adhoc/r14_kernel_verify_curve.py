"""Round 14 (AMD EPYC, one thread): SmolLM2's verify forward over 1 + k tokens (decoder and LM head, k = 0 .. 5)
with the few-row kernel routing the linears as the engine does (FewRowLinears; one row stays on F.linear), after a
300-token prompt, sizes interleaved within each round; medians in one-token decodes. Round 13 suspected that the
learned curve's k = 1 at 1.00 was too low; this measured 1.03. Usage: python examples/adhoc/r14_kernel_verify_curve.py ROUNDS"""
import statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.few_row_linear import FewRowLinears
from selfspec.loading import load_model
from selfspec.target import TargetModel
model = load_model("smollm2"); target = TargetModel(model); routed = FewRowLinears(model)
prompt = torch.arange(300) % 1000 + 100
cache = target.new_cache()
with torch.inference_mode():
    target.forward(prompt, cache)
    times = {k: [] for k in range(6)}
    for r in range(int(sys.argv[1])):
        for k in range(6):
            ids = torch.arange(k + 1) + 7
            t = time.perf_counter()
            with routed:
                logits = target.logits(target.forward(ids, cache))
            times[k].append(time.perf_counter() - t)
            cache.rollback(prompt.shape[0])
    d = statistics.median(times[0])
    print("decode ms %.1f" % (d * 1e3), " ".join("k=%d %.2f" % (k, statistics.median(v) / d) for k, v in times.items()))
