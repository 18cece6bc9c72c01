"""The round-7 GPU diagnostic (examples/gpu/README.md), from the repository root on a CUDA machine:

    python3 examples/gpu/diag.py shapes bfloat16 3   # the reference model's first and next 3 forwards per draft size
    python3 examples/gpu/diag.py run bfloat16 3      # generate vs selfspec off / medusa "auto" / k=3 / tree "auto",
                                                     # 3 code prompts x 3 rounds x 64 tokens; the last argument is
                                                     # selfspec.draft_length.verify_cost.OUTLIER_RATIO (1e9: no clipping)
    python3 examples/gpu/diag.py run bfloat16 3 nocudnn   # the same with cuDNN's attention backend turned off

An ad hoc script (not interleaved like the benchmark: generate, then each wrapper in turn, per prompt and round).
"""
import os, statistics, sys, tempfile, time
sys.path.insert(0, os.getcwd())
import torch
import selfspec.draft_length.verify_cost as vc
from selfspec import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids

part, dtype, ratio = sys.argv[1], sys.argv[2], float(sys.argv[3])
if "nocudnn" in sys.argv[4:]:  # the next hypothesis to test (README.md): cuDNN attention plans per new shape
    torch.backends.cuda.enable_cudnn_sdp(False)
os.environ["SELFSPEC_CACHE_DIR"] = tempfile.mkdtemp()
settings = parse_args(["--device", "cuda", "--dtype", dtype])
loaded = load(settings, [])
model = loaded.model
sync = torch.cuda.synchronize
if part == "shapes":
    from transformers import DynamicCache
    ids = torch.randint(0, 1000, (1, 160), device="cuda")
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(ids[:, :150], past_key_values=cache, use_cache=True)
        for k in [0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 47]:
            times = []
            for _ in range(4):
                sync(); t = time.perf_counter()
                model(ids[:, 150:151 + k] if k < 10 else torch.randint(0, 1000, (1, k + 1), device="cuda"),
                      past_key_values=cache, use_cache=True)
                sync(); times.append(1e3 * (time.perf_counter() - t))
                cache.crop(-(k + 1))
            print(f"{dtype} k={k}: " + " ".join(f"{x:.2f}" for x in times) + " ms", flush=True)
    sys.exit()
vc.OUTLIER_RATIO = ratio
kind, texts = prompt_texts(loaded.tokenizer, 3)
prompts = prompt_ids(loaded.tokenizer, texts, kind, 256, 64, "cuda")
specs = {"off": (SelfSpecModel(model, drafter="none"), 0), "auto": (SelfSpecModel(model, heads=loaded.heads), "auto"),
         "k3": (SelfSpecModel(model, heads=loaded.heads), 3),
         "tree47": (SelfSpecModel(model, heads=loaded.heads, tree_size="auto"), "auto")}
for name, (spec, k) in specs.items():  # warm-up as the bench does: one short run
    spec.generate(prompts[0][0, -32:], max_new_tokens=64, num_draft_tokens=k)
rows = {name: [] for name in specs}
rows["generate"] = []
for rnd in range(3):
    for p in prompts:
        sync(); t = time.perf_counter()
        model.generate(p, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=loaded.eos_token_id)
        sync(); rows["generate"].append((time.perf_counter() - t, 1.0))
        for name, (spec, k) in specs.items():
            sync(); t = time.perf_counter()
            out = spec.generate(p[0], max_new_tokens=64, num_draft_tokens=k, eos_token_id=[])
            sync(); rows[name].append((time.perf_counter() - t, out.stats.tokens_per_forward))
base = statistics.median(s for s, _ in rows["generate"])
for name, r in rows.items():
    print(f"{dtype} ratio={ratio:g} {name:9s} speedup {base / statistics.median(s for s, _ in r):.2f}x  tok/fwd "
          + " ".join(f"{f:.2f}" for _, f in r), flush=True)
for name in ("auto", "tree47"):
    c = specs[name][0]._verify_cost
    print(f"{dtype} ratio={ratio:g} {name} learned curve: " + " ".join(f"{x:.2f}" for x in c.relative) if c else "none")
