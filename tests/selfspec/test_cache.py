"""The cache: write, roll back, rewrite; its length tracks the committed sequence; memory stays bounded."""
import torch

from selfspec import Draft, SelfSpecModel
from selfspec.cache import KVCache
from selfspec.cache_layer import SPARE_COLUMNS
from selfspec.target import TargetModel
from tests.conftest import column_bytes, random_prompt, tiny_model


def layer_kv(cache: KVCache):
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.hf_cache.layers]


def test_rollback_then_rewrite_equals_writing_the_accepted_tokens_directly():
    model = tiny_model("llama")
    target = TargetModel(model)
    ids = random_prompt(12, seed=1)[0]
    direct = target.new_cache()
    target.forward(ids[:9], direct)

    speculative = target.new_cache()
    target.forward(ids[:6], speculative)
    target.forward(torch.tensor([ids[6], 7, 8, 9]), speculative)  # one correct token, three wrong drafts
    speculative.rollback(7)
    assert speculative.length == 7
    target.forward(ids[7:9], speculative)
    for (k1, v1), (k2, v2) in zip(layer_kv(direct), layer_kv(speculative)):
        assert torch.allclose(k1, k2) and torch.allclose(v1, v2)


def test_rollback_refuses_to_grow():
    model = tiny_model("gpt2")
    target = TargetModel(model)
    cache = target.new_cache()
    target.forward(random_prompt(5)[0], cache)
    try:
        cache.rollback(6)
    except ValueError as err:
        assert "forward" in str(err)
    else:
        raise AssertionError("rollback to a longer length must fail")


class WrongDrafter:
    """Always drafts tokens the model will not choose (greedy), and checks the cache on every call."""

    def __init__(self, model_continuation, num_draft_tokens):
        self.continuation = model_continuation
        self.num_draft_tokens = num_draft_tokens
        self.cache_lengths, self.cache_bytes = [], []

    def propose(self, context):
        n = context.token_ids.shape[0]
        self.cache_lengths.append((context.cache.length, n - 1))
        self.cache_bytes.append(context.cache.nbytes())
        right = self.continuation[n : n + context.num_draft_tokens]
        return Draft((right + 1) % 90 + 3)  # differs from the model's token at every position

    def observe(self, num_drafted, num_accepted):
        assert num_accepted == 0


def test_cache_length_equals_committed_length_and_memory_does_not_grow_with_rejections():
    model = tiny_model("qwen2")
    prompt = random_prompt(8, seed=2)
    continuation = model.generate(prompt, max_new_tokens=150, do_sample=False, eos_token_id=None,
                                  attention_mask=torch.ones_like(prompt))[0]
    drafter = WrongDrafter(continuation, 6)
    out = SelfSpecModel(model, drafter=drafter).generate(prompt, max_new_tokens=150, num_draft_tokens=6,
                                                         eos_token_id=[])
    assert torch.equal(out.sequences[0], continuation)
    assert out.stats.drafted > 500 and out.stats.accepted == 0
    # Before every proposal the cache holds exactly the committed tokens (all but the pending one).
    assert all(cache_len == committed for cache_len, committed in drafter.cache_lengths)
    # Storage is what the committed tokens plus one step's drafts need, and the in-place layers' spare columns: no
    # trace of the ~900 rejected tokens.
    final_bound = (prompt.shape[1] + 150 + 7 + SPARE_COLUMNS) * column_bytes(model)
    assert max(drafter.cache_bytes) <= final_bound


def test_a_generation_allocates_its_cache_once(monkeypatch):
    """The engine reserves the prompt, its new tokens and the widest verify block: each layer's buffers are allocated
    at the first write and never again while drafting, rejecting and rolling back. Catches (planted): no reservation
    (the buffers then grow SPARE_COLUMNS at a time)."""
    from selfspec.cache_layer import AppendInPlaceLayer

    model = tiny_model("llama")
    allocations = []
    real = AppendInPlaceLayer._reallocate

    def counted(layer, *args):
        allocations.append(layer)
        return real(layer, *args)

    monkeypatch.setattr(AppendInPlaceLayer, "_reallocate", counted)
    engine = SelfSpecModel(model, drafter="ngram")
    prompt = random_prompt(8, seed=3)
    engine.generate(prompt, max_new_tokens=4)  # (the wrapper's first-call checks make caches of their own)
    allocations.clear()
    out = engine.generate(prompt, max_new_tokens=2 * SPARE_COLUMNS + 10, num_draft_tokens=3, eos_token_id=[])
    assert out.stats.drafted > 0
    assert len(allocations) == model.config.num_hidden_layers == len(set(map(id, allocations)))
    monkeypatch.setattr(KVCache, "reserve", lambda cache, tokens: None)
    allocations.clear()
    engine.generate(prompt, max_new_tokens=2 * SPARE_COLUMNS + 10, num_draft_tokens=3, eos_token_id=[])
    assert len(allocations) > model.config.num_hidden_layers
