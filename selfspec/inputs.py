"""What a prompt may be before the first step: chat messages, a tokenizer's padded batch and its attention mask,
lengths within the model's context window. Knows the tokenizer's chat template, never the model."""
from __future__ import annotations

import torch


def check_lengths(prompt_len: int, max_new_tokens: int, max_positions: int | None) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if max_positions is not None and prompt_len + max_new_tokens > max_positions:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context window "
            f"of {max_positions} positions; shorten the prompt or lower max_new_tokens"
        )


def is_chat(input_ids) -> bool:
    return isinstance(input_ids, (list, tuple)) and len(input_ids) > 0 and isinstance(input_ids[0], dict)


def apply_chat_template(tokenizer, messages) -> list[int]:
    """[{"role", "content"}, ...] -> ids of the conversation plus the assistant's generation prompt."""
    if tokenizer is None:
        raise ValueError("chat messages need a tokenizer: pass tokenizer=... to SelfSpecModel or use from_pretrained")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"the tokenizer ({type(tokenizer).__name__}) has no chat template, so chat messages cannot be formatted: "
            "set tokenizer.chat_template, or pass the prompt as text or token ids"
        )
    return list(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, return_dict=False))


def unpadded_prompts(input_ids, attention_mask):
    """A tokenizer's output (`tokenizer(texts, padding=True, return_tensors="pt")`: input ids [B, T] or [T] and their
    attention mask, 1 at tokens and 0 at padding, on the left or the right of each row) -> its prompts without the
    padding: one [T_i] tensor when B is 1, else a list of them (what `generate` decodes as a batch)."""
    if isinstance(input_ids, str) or is_chat(input_ids):
        raise ValueError("attention_mask goes with token ids ([B, T] or [T], as a tokenizer returns them); a text or "
                         "chat prompt needs none: drop attention_mask")
    ids, mask = torch.as_tensor(input_ids), torch.as_tensor(attention_mask)
    if mask.shape != ids.shape or ids.dim() not in (1, 2):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)} and input_ids {tuple(ids.shape)}: they must "
                         "be the same [B, T] or [T] shape, as a tokenizer returns them")
    if not ((mask == 0) | (mask == 1)).all():
        raise ValueError("attention_mask must hold 1 at tokens and 0 at padding, nothing else")
    prompts = []
    for row, (row_ids, row_mask) in enumerate(zip(ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, ids.shape[-1]))):
        kept = row_mask.nonzero().flatten()  # [T_i] positions of the row's tokens
        if kept.numel() == 0:
            raise ValueError(f"row {row} of attention_mask is all padding: an empty prompt")
        first, last = int(kept[0]), int(kept[-1])
        if last - first + 1 != kept.numel():
            raise ValueError(f"row {row} of attention_mask has padding between tokens; selfspec takes left- or "
                             "right-padded rows (what a tokenizer's padding=True gives)")
        prompts.append(row_ids[first:last + 1])
    return prompts[0] if len(prompts) == 1 else prompts
