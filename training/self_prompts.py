"""User turns written by the base itself, for self-distillation on prompts as varied as its own idea of a user.

A chat model given its template's opening of a user turn (system turn included, the user's text left empty) writes
a plausible user request and closes the turn (the idea of Magpie, Xu et al. 2024). Sampled at T=1 with top-p 0.95,
SmolLM2-135M-Instruct writes questions, plans, coding help, advice and stories on open-ended topics, which no
fixed template x topic set reaches. Turns that do not close within `max_tokens`, are too short, repeat an earlier
one, or touch a held-out benchmark topic or opening (`training.prompts.is_held_out`) are dropped. Knows the model
and tokenizer as `transformers` objects; knows nothing about heads.
"""
from __future__ import annotations

import torch

from training.prompts import is_held_out

TEMPERATURE = 1.0  # the model's own law: lower temperatures repeat a few openings ("Can you help me...")
TOP_P = 0.95  # cuts the tail that turns a user request into noise


def _around_user_text(tokenizer) -> tuple[str, str]:
    """The tokenizer's chat template rendered around one user turn: (text before the user's text, text after it)."""
    marker = "\u2063MARK\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                         add_generation_prompt=False)
    if marker not in text:
        raise ValueError("the chat template does not place the user's text verbatim: it cannot write user turns")
    before, after = text.split(marker, 1)
    return before, after


def user_turn_prefix(tokenizer) -> list[int]:
    """The ids a user turn's text follows in the tokenizer's chat template (the default system turn included)."""
    return tokenizer(_around_user_text(tokenizer)[0], add_special_tokens=False)["input_ids"]


def end_of_turn_ids(tokenizer, model) -> list[int]:
    """Token ids that close a user turn: the first token the template puts after the user's text (<|im_end|>,
    <|eot_id|>, ...) and the model's EOS."""
    after = tokenizer(_around_user_text(tokenizer)[1], add_special_tokens=False)["input_ids"]
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return sorted(ids | set(after[:1]))


def keep(text: str, seen: set[str], min_words: int = 4) -> bool:
    """Whether a written user turn is kept: long enough, new, and about nothing the benchmark holds out."""
    key = " ".join(text.lower().split())
    if len(key.split()) < min_words or key in seen or is_held_out(text):
        return False
    seen.add(key)
    return True


@torch.no_grad()
def write_user_turns(model, tokenizer, count: int, seed: int, seen: set[str] | None = None,
                     max_tokens: int = 64) -> list[str]:
    """Up to `count` user turns the model writes itself (one batched sampled generate of `count` rows, all from the
    same prefix, so no padding); only closed, kept turns are returned (`keep`), so fewer may come back."""
    seen = set() if seen is None else seen
    prefix = torch.tensor([user_turn_prefix(tokenizer)], device=model.device)
    stops = end_of_turn_ids(tokenizer, model)
    torch.manual_seed(seed)
    rows = model.generate(prefix.repeat(count, 1), attention_mask=torch.ones_like(prefix).repeat(count, 1),
                          do_sample=True, temperature=TEMPERATURE, top_p=TOP_P, top_k=None, max_new_tokens=max_tokens,
                          eos_token_id=stops, pad_token_id=stops[0])
    turns = []
    for row in rows[:, prefix.shape[1]:].tolist():
        closed = next((i for i, token in enumerate(row) if token in stops), None)
        if closed is None:  # ran past max_tokens: a turn cut off mid-sentence is not a request
            continue
        text = tokenizer.decode(row[:closed], skip_special_tokens=True).strip()
        if keep(text, seen):
            turns.append(text)
    return turns
