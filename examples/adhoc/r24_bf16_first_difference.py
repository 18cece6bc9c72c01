"""Round 24 (the Intel Xeon with AMX, one thread): SmolLM2 cast to bfloat16, greedy, 96 tokens on 2 held-out chat
prompts: speculation off and the EAGLE chain against bfloat16 `generate`; where a run differs, the first differing
position and the two best logits of one bfloat16 forward over the common prefix (a near-tie shows the difference is
rounding, not a wrong verdict). Round 24, three runs (the third after the script moved onto harness.timed_call):
off identical on both prompts every time; the chain parted on the first prompt at position 37, 82, 37 (top-2 logits
11.812 / 11.75, 24.625 / 24.5, 11.812 / 11.75) and on the second at 5, 5, 90 (29.375 / 29.375, a tie in bfloat16;
26.5 / 26.375): where it parts depends on the draft lengths "auto" chose, which follow timings.
Usage: python examples/adhoc/r24_bf16_first_difference.py"""
import torch
import transformers
from harness import smollm2_chat, timed_call

from selfspec import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(2, 96)
model = model.to(torch.bfloat16)
specs = {"off": SelfSpecModel(model, drafter="none", tokenizer=tokenizer),
         "chain": SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_size=None)}
kwargs = dict(max_new_tokens=96, do_sample=False, eos_token_id=[])
for prompt in prompts:
    plain = timed_call(model, tokenizer, None, prompt, **kwargs).new_tokens
    for name, spec in specs.items():
        new = timed_call(model, tokenizer, spec, prompt, **kwargs).new_tokens
        i = next((i for i, (a, b) in enumerate(zip(new, plain)) if a != b), None)
        if i is None:
            print(name, "identical")
            continue
        with torch.no_grad():
            logits = model(torch.cat([prompt[0], torch.tensor(plain[:i])])[None]).logits[0, -1].float()
        top = logits.topk(2)
        print(name, "first difference at", i, "generate", plain[i], "selfspec", new[i],
              "top-2 logits", [round(v, 3) for v in top.values.tolist()], top.indices.tolist())
