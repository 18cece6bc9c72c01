"""What a prompt may be before the first step: chat messages, lengths within the model's context window. Knows the
tokenizer's chat template, never the model."""
from __future__ import annotations


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
