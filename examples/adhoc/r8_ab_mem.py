"""Paired A/B on the reference model (or smollm2): off vs "auto" resuming across calls vs "auto" starting afresh."""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
from selfspec.bench.methods import random_heads
ROUNDS = int(sys.argv[1]); args = sys.argv[2:]
settings = parse_args(args); loaded = load(settings, [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 4)
N = settings.max_new_tokens
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 256, N, "cpu")]
noise = random_heads(model, like=loaded.heads, seed=2)
cases = {
    "random heads": lambda: SelfSpecModel(model, "medusa", heads=noise),
    "medusa": lambda: SelfSpecModel(model, heads=loaded.heads_dir, tokenizer=loaded.tokenizer),
    "early exit": lambda: SelfSpecModel(model, "early_exit", exit_layer=loaded.untrained_exit_layer),
}
off = SelfSpecModel(model, drafter="none")
rng = random.Random(0)
for mode, kw in (("sampled", dict(do_sample=True, temperature=0.7, top_p=0.9)), ("greedy", {})):
    kw = dict(max_new_tokens=N, eos_token_id=[], **kw)
    for case, build in cases.items():
        mem, fresh = build(), build()
        fresh._resumed = lambda policy, options: policy
        variants = {"off": off, "resume": mem, "afresh": fresh}
        for s in variants.values():
            s.generate(prompts[0][-32:], **{**kw, "max_new_tokens": 32})
        times = {k: [] for k in variants}; drafted = {k: 0 for k in variants}
        for rnd in range(ROUNDS):
            for i, p in enumerate(prompts):
                order = list(variants); rng.shuffle(order)
                for name in order:
                    torch.manual_seed(rnd * 100 + i)
                    t = time.perf_counter(); out = variants[name].generate(p, **kw); times[name].append(time.perf_counter() - t)
                    drafted[name] += out.stats.drafted
        print(f"{mode:8s} {case:14s} resume/off {statistics.median(o/n for o, n in zip(times['off'], times['resume'])):.3f} "
              f"afresh/off {statistics.median(o/n for o, n in zip(times['off'], times['afresh'])):.3f}  "
              f"resume/afresh {statistics.median(a/n for a, n in zip(times['afresh'], times['resume'])):.3f}  drafted {drafted}", flush=True)
