"""Prototype (round 11, AMD EPYC, not in the library): every F.linear over 2..5 rows inside the target's verify forwards
and logits computed as torch.mm(W, x.T).T (a TorchFunctionMode patched around TargetModel.forward / logits), against
the library as it was (0b59ece), SmolLM2 EAGLE greedy, 2 prompts x 96 tokens, interleaved. 2 rounds: "auto" 1.10x ->
0.90x, k=1 0.97x -> 0.88x, k=3 0.95x -> 0.96x of generate; the microbenchmark's gains did not carry over.
Usage: python examples/adhoc/r11_orientation_proto.py ROUNDS"""
import random, statistics, sys, time, torch, transformers
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from selfspec.engine import SelfSpecModel
from selfspec.target import TargetModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
torch.set_num_threads(1); transformers.logging.set_verbosity_error()
ON = [False]
class SmallM(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            x, w = args[0], args[1]
            rows = x.numel() // x.shape[-1]
            if 2 <= rows <= 5:
                b = args[2] if len(args) > 2 else (kwargs or {}).get("bias")
                y = torch.mm(w, x.reshape(rows, -1).t()).t()
                if b is not None: y = y + b
                return y.reshape(*x.shape[:-1], w.shape[0])
        return func(*args, **(kwargs or {}))
orig_fwd, orig_logits = TargetModel.forward, TargetModel.logits
def fwd(self, ids, cache, *a, **k):
    if ON[0] and ids.shape[0] > 1:
        with SmallM(): return orig_fwd(self, ids, cache, *a, **k)
    return orig_fwd(self, ids, cache, *a, **k)
def logits(self, h, *a, **k):
    if ON[0] and 2 <= h.numel() // h.shape[-1] <= 5:
        with SmallM(): return orig_logits(self, h, *a, **k)
    return orig_logits(self, h, *a, **k)
TargetModel.forward, TargetModel.logits = fwd, logits
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, 2)
prompts = list(prompt_ids(tokenizer, texts, kind, 2048, 128, "cpu"))
spec = SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer)
kw = dict(max_new_tokens=96, do_sample=False, eos_token_id=[])
variants = {"generate": None, "auto": ("auto", False), "k=1": (1, False), "k=3": (3, False),
            "auto mmT": ("auto", True), "k=1 mmT": (1, True), "k=2 mmT": (2, True), "k=3 mmT": (3, True), "k=4 mmT": (4, True)}
def run(v, p):
    t = time.perf_counter()
    if v is None:
        model.generate(p, pad_token_id=tokenizer.eos_token_id, **kw); return time.perf_counter() - t, 1.0, None
    ON[0] = v[1]
    out = spec.generate(p[0], num_draft_tokens=v[0], **kw); ON[0] = False
    return time.perf_counter() - t, out.stats.tokens_per_forward, out.sequences
spec.generate(prompts[0][0][-32:], max_new_tokens=32, eos_token_id=[])
times, tpf, rng = {v: [] for v in variants}, {v: [] for v in variants}, random.Random(0)
seqs = {}
for r in range(int(sys.argv[1])):
    for i, p in enumerate(prompts):
        order = list(variants); rng.shuffle(order)
        for name in order:
            s, t, q = run(variants[name], p)
            times[name].append(s); tpf[name].append(t)
            if q is not None:
                if i in seqs and not torch.equal(seqs[i], q): print("DIFFERENT", name, i)
                seqs.setdefault(i, q)
for name in variants:
    ratios = [g / t for g, t in zip(times["generate"], times[name])]
    print(f"{name:9s} {statistics.median(ratios):.2f}x of generate ({min(ratios):.2f}-{max(ratios):.2f}), {statistics.median(tpf[name]):.2f} tok/fwd", flush=True)
