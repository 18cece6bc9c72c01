"""The benchmark's held-out prompts: chat questions for a model with a chat template, Python code otherwise.

Both sets are fixed data shipped with the package (no corpus, no training code at run time), so numbers stay
comparable between runs and machines. Knows text and token ids; knows nothing about decoding.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

# Evaluation chat prompts: hand-written questions whose topics appear in no training prompt of
# `training/prompts.py` (which imports them from here; its tests check the two sets share no topic).
CHAT_PROMPTS = (
    "What are the benefits of learning to play the piano as an adult?",
    "How do submarines dive and surface?",
    "Write a short motivational message for someone starting a new job.",
    "Explain how a refrigerator keeps food cold.",
    "What is the difference between a virus and a bacterium?",
    "Give me a simple recipe for pancakes.",
    "Why do leaves change color in autumn?",
    "How can I improve my handwriting?",
    "Describe the life cycle of a butterfly.",
    "What makes a good team leader?",
    "How do airplanes stay in the air?",
    "Write a limerick about a cat who loves cheese.",
    "What are some ways to save money on groceries?",
    "Explain what a compiler does.",
    "How do glaciers shape the landscape?",
    "What should I pack for a weekend camping trip?",
)

CODE_PROMPTS_FILE = Path(__file__).with_name("code_prompts.json")


@functools.lru_cache(maxsize=None)
def code_prompts() -> tuple[str, ...]:
    """16 prompts of about 400 characters, each opening a def/class of a standard-library file the reference model
    never trained on (how they were made: the file's "source" entry)."""
    return tuple(json.loads(CODE_PROMPTS_FILE.read_text(encoding="utf-8"))["prompts"])


def is_chat(tokenizer) -> bool:
    return getattr(tokenizer, "chat_template", None) is not None


def prompt_texts(tokenizer, num_prompts: int) -> tuple[str, list[str]]:
    """("chat" or "code", the first num_prompts prompts of that kind)."""
    kind, texts = ("chat", CHAT_PROMPTS) if is_chat(tokenizer) else ("code", code_prompts())
    if not 1 <= num_prompts <= len(texts):
        raise SystemExit(f"selfspec.bench: --num-prompts must be 1 .. {len(texts)} for {kind} prompts, got {num_prompts}")
    return kind, list(texts[:num_prompts])


def prompt_ids(tokenizer, texts: list[str], kind: str, max_positions: int | None, max_new_tokens: int,
               device) -> list[torch.Tensor]:
    """[1, T] ids per prompt: chat prompts as one user turn through the chat template with the generation prompt,
    code as plain text; cut from the left so prompt + max_new_tokens fits the model's positions."""
    out = []
    for text in texts:
        if kind == "chat":
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        else:
            ids = tokenizer(text).input_ids
        ids = torch.tensor([list(ids)], device=device)
        if max_positions is not None:
            ids = ids[:, -(max_positions - max_new_tokens - 1):]
        out.append(ids)
    return out



def label(text: str) -> str:
    """The prompt's first non-empty line: enough to recognise it by in the report."""
    return next((line for line in text.splitlines() if line.strip()), "")
