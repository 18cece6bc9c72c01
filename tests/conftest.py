"""Shared fixtures: tiny random decoders built in code (no downloads), one torch thread (tiny models run fastest
on one, and tests must not fight a benchmark or training job for cores), and a private selfspec cache directory per
test (the verify-cost curves `num_draft_tokens="auto"` keeps), so no test reads what another run learned and none
writes into the user's ~/.cache."""
from __future__ import annotations

import pytest
import torch
import transformers

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

VOCAB = 96


def tiny_config(family: str, vocab_size: int = VOCAB, num_layers: int = 2, hidden: int = 32, max_positions: int = 512):
    """A tiny config of one decoder family; ids 0..2 are bos/eos/pad so random prompts can avoid them."""
    common = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    llama_like = dict(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_positions, **common,
    )
    if family == "llama":
        return transformers.LlamaConfig(**llama_like)
    if family == "qwen2":
        return transformers.Qwen2Config(**llama_like)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=hidden // 4, **llama_like)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=None, **llama_like)
    if family == "gemma":
        return transformers.GemmaConfig(head_dim=hidden // 4, **llama_like)
    if family == "phi3":
        return transformers.Phi3Config(**{**llama_like, "num_key_value_heads": 4})
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=hidden, n_layer=num_layers, n_head=4, n_positions=max_positions, **common)
    raise ValueError(family)


def tiny_model(family: str = "llama", seed: int = 0, dtype=torch.float64, **config_kwargs):
    """A tiny random causal LM in eval mode; float64 by default so numerical noise cannot flip an argmax."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, **config_kwargs))
    return model.to(dtype).eval()


def column_bytes(model, batch_size: int = 1) -> int:
    """Bytes one position of every layer's keys and values takes in a KV cache of `model` (from its shapes, not from
    storage, which may hold spare columns)."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.empty((), dtype=next(model.parameters()).dtype).element_size()
    return 2 * config.num_hidden_layers * batch_size * heads * head_dim * element


def random_prompt(length: int = 12, vocab_size: int = VOCAB, seed: int = 0) -> torch.Tensor:
    """[1, length] ids from 3..vocab-1 (avoiding the special ids)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (1, length), generator=g)


def repetitive_prompt(length: int = 24, vocab_size: int = VOCAB, period: int = 5, seed: int = 0) -> torch.Tensor:
    """[1, length] a repeated random phrase: gives the n-gram drafter something to find."""
    phrase = random_prompt(period, vocab_size, seed)[0]
    return phrase.repeat(length // period + 1)[:length][None]


@pytest.fixture(autouse=True, scope="session")
def _private_selfspec_cache_for_the_session(tmp_path_factory):
    """Wider fixtures (a module's wrapper) are built before a test's own cache dir is set: they get this one, so no
    test writes into the user's cache directory (a wrapper keeps its kernel route there when it is built)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path_factory.mktemp("selfspec-session-cache")))
        yield


@pytest.fixture(autouse=True)
def _private_selfspec_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path_factory.mktemp("selfspec-cache")))


@pytest.fixture
def needs_kernel():
    """Skip where selfspec's few-row kernel cannot run (not x86 with AVX2, no C compiler); built in the test's private
    cache dir."""
    from selfspec.kernel.few_row_linear import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"kernel unavailable: {unavailable_reason()}")


@pytest.fixture(params=["llama", "qwen2", "gpt2"])
def family(request):
    return request.param
