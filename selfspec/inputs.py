"""What a prompt may be before the first step: chat messages, a tokenizer's padded batch and its attention mask,
lengths within the model's context window; and what a tokenizer must be to serve the model. Knows the tokenizer's chat
template, never the model."""
from __future__ import annotations

import os
from collections.abc import Mapping

import torch


def check_tokenizer(tokenizer, vocab_size: int) -> None:
    """A tokenizer given to the wrapper (None: none) must be a tokenizer object, not its name, and all its ids must be
    ids of the model's vocabulary (which is often larger, padded; never smaller for the model's own tokenizer)."""
    if tokenizer is None:
        return
    if isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(f"tokenizer={str(tokenizer)!r} is a name, not a tokenizer: load it first, "
                        f"tokenizer=AutoTokenizer.from_pretrained({str(tokenizer)!r})")
    if not callable(tokenizer) or not hasattr(tokenizer, "decode"):
        raise TypeError(f"tokenizer must be a tokenizer (called on text, with decode(ids)), such as "
                        f"AutoTokenizer.from_pretrained(...) returns; got {type(tokenizer).__name__}")
    if hasattr(tokenizer, "__len__") and len(tokenizer) > vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary only {vocab_size}: it "
                         "belongs to another model (its ids would mean other tokens here); pass the tokenizer saved "
                         "with this model")


def check_prompt_form(input_ids) -> None:
    """Refuse, saying what to pass instead, what is not a prompt: nothing, a tokenizer's output (a mapping), or one
    chat message."""
    if input_ids is None:
        raise TypeError("the prompt is None: pass text, token ids, or chat messages [{'role': ..., 'content': ...}]")
    if isinstance(input_ids, Mapping):
        if "role" in input_ids or "content" in input_ids:
            raise TypeError("the prompt is one chat message (a dict): wrap the message in a list: generate([message])")
        if "input_ids" in input_ids:
            raise TypeError("the prompt is a tokenizer's output (input_ids, attention_mask, ...): unpack it, use "
                            "generate(**encoding) (or stream(**encoding))")
        raise TypeError(f"the prompt is a mapping (keys {sorted(map(str, input_ids))[:4]}): pass text, token ids, or "
                        "chat messages")


def holds_integers(tensor: torch.Tensor) -> bool:
    """Whether a tensor's dtype can hold token ids: an integer dtype, not bool, floating or complex."""
    return not (tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex())


def check_id_dtype(ids: torch.Tensor) -> None:
    """Token ids must be integers: a float or bool tensor (or a list of floats) is refused, not rounded."""
    if ids.numel() and not holds_integers(ids):
        raise TypeError(f"token ids must be integers, got {ids.dtype} ids: pass a torch.long tensor or a list of ints "
                        "(as tokenizer(text, return_tensors='pt').input_ids gives them)")


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
