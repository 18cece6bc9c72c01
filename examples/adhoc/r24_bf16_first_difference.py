"""Round 24 (the Intel Xeon with AMX, one thread): SmolLM2 cast to bfloat16, greedy, 96 tokens on 2 held-out chat
prompts: speculation off and the EAGLE chain against bfloat16 `generate`; where a run differs, the first differing
position and the two best logits of one bfloat16 forward over the common prefix (a near-tie shows the difference is
rounding, not a wrong verdict). Round 24, two runs: off identical on both prompts; the chain parted on the first
prompt at position 37 (top-2 logits 11.812 / 11.75), then 82 (24.625 / 24.5): where it parts depends on the draft
lengths "auto" chose, which follow timings; on the second at 5 in both (29.375 / 29.375, a tie in bfloat16).
Usage: python examples/adhoc/r24_bf16_first_difference.py"""
import torch
import transformers
from harness import smollm2_chat

from selfspec import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(2, 96)
model = model.to(torch.bfloat16)
specs = {"off": SelfSpecModel(model, drafter="none", tokenizer=tokenizer),
         "chain": SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_size=None)}
for prompt in prompts:
    plain = model.generate(prompt, max_new_tokens=96, do_sample=False, eos_token_id=[],
                           pad_token_id=tokenizer.eos_token_id, attention_mask=torch.ones_like(prompt))
    plain = plain[0, prompt.shape[1]:]
    for name, spec in specs.items():
        out = spec.generate(prompt[0], max_new_tokens=96, do_sample=False, eos_token_id=[])
        new = out.sequences[0, prompt.shape[1]:]
        differ = (new != plain).nonzero()
        if not len(differ):
            print(name, "identical")
            continue
        i = int(differ[0])
        with torch.no_grad():
            logits = model(torch.cat([prompt[0], plain[:i]])[None]).logits[0, -1].float()
        top = logits.topk(2)
        print(name, "first difference at", i, "generate", int(plain[i]), "selfspec", int(new[i]),
              "top-2 logits", [round(v, 3) for v in top.values.tolist()], top.indices.tolist())
