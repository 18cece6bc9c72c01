"""What the ad hoc A/B scripts share from round 18's last ones on (earlier ones repeat it, frozen as run): one timed
call of plain `generate` or of a SelfSpecModel, and the reference model's batch of code prompts."""
import time

import torch

REFERENCE = "examples/reference/model"


def timed_call(model, tokenizer, spec, prompt: torch.Tensor, **kwargs) -> tuple[float, float, list[int]]:
    """(seconds, tokens per target forward, new token ids) of `model.generate` (spec None) or `spec.generate` on the
    [1, T] prompt with the same keyword arguments."""
    started = time.perf_counter()
    if spec is None:
        out = model.generate(prompt, pad_token_id=tokenizer.eos_token_id, attention_mask=torch.ones_like(prompt),
                             **kwargs)
        return time.perf_counter() - started, 1.0, out[0, prompt.shape[1]:].tolist()
    out = spec.generate(prompt[0], **kwargs)
    return time.perf_counter() - started, out.stats.tokens_per_forward, out.sequences[0, prompt.shape[1]:].tolist()


def reference_batch(batch_size: int, max_new_tokens: int = 96):
    """(a SelfSpecModel of the reference model with its Medusa heads, `batch_size` [T] held-out code prompts cut to
    leave room for max_new_tokens, cycling through 16 when more are asked)."""
    from selfspec.bench.prompts import prompt_ids, prompt_texts
    from selfspec.engine import SelfSpecModel
    from selfspec.loading import load_model, load_tokenizer

    model, tokenizer = load_model(REFERENCE), load_tokenizer(REFERENCE)
    kind, texts = prompt_texts(tokenizer, 16)
    pool = prompt_ids(tokenizer, texts, kind, 8192, max_new_tokens, "cpu")
    spec = SelfSpecModel(model, heads="examples/reference/heads", tokenizer=tokenizer)
    return spec, [pool[i % len(pool)][0] for i in range(batch_size)]
