"""What the ad hoc A/B scripts share from round 19 on (earlier ones repeat it, frozen as run): one timed call of plain
`generate` or of a SelfSpecModel on a [1, T] prompt."""
import time

import torch


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
