"""A tiny byte-level BPE tokenizer trained in code (no downloads), a tiny model sized for it, and both saved as a
model directory. Its sentences hold multi-byte characters, so random models emit partial UTF-8 pieces."""
from __future__ import annotations

import functools

import torch

from tests.conftest import tiny_model

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Café au lait, crème brûlée et pâté.",
    "日本語のテキストも少し。",
    "def main():\n    return 42\n",
    "Prices: 5€, 3£, 10¥ — naïve façade.",
    "stop here, then stop again; the end.",
]
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>"]  # ids 0..4, like tiny_config's 0..2
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB = 300


@functools.lru_cache(maxsize=None)
def _trained():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(SENTENCES * 3, trainer)
    return tokenizer


def tiny_tokenizer(chat_template: bool = True):
    """A fresh PreTrainedTokenizerFast of VOCAB ids (bos 0, eos 1, pad 2), with a chat template unless told not."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_trained(), bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_text_model(seed: int = 0, dtype=torch.float64, **config_kwargs):
    """tests.conftest.tiny_model with a vocabulary the size of tiny_tokenizer's."""
    return tiny_model(seed=seed, dtype=dtype, vocab_size=VOCAB, **config_kwargs)


def save_model_dir(directory, seed: int = 0, dtype=torch.float32, chat_template: bool = True):
    """A tiny model + tokenizer saved as a `from_pretrained` directory; returns its path as a string."""
    model = tiny_text_model(seed=seed, dtype=dtype)
    model.save_pretrained(directory)
    tiny_tokenizer(chat_template).save_pretrained(directory)
    return str(directory)
