"""The engine's attention paths: on CUDA without cuDNN's kernel; on CPU, grouped key/value heads read in place by the
kernel, computing what transformers' sdpa attention computes bit for bit. Each only while a decode step runs."""
import itertools

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from selfspec.attention_backends import (
    attention_route, each_resumption, engine_attention, grouped_kv_in_kernel, grouped_kv_sdpa,
)
from selfspec.engine import SelfSpecModel
from tests.conftest import repetitive_prompt, tiny_model
from tests.selfspec.exercised import assert_exercised, greedy_sequences


def steps():
    for _ in range(3):
        yield torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()


def test_cuda_steps_run_without_cudnn_attention_and_the_caller_keeps_its_settings():
    assert torch.backends.cuda.cudnn_sdp_enabled()
    seen = [(inside, torch.backends.cuda.cudnn_sdp_enabled()) for inside in engine_attention(steps(), "cuda")]
    # inside a step: cuDNN off, the other kernels on; between steps (the caller's code): as it was (no GPU needed)
    assert seen == [((False, True), True)] * 3


def test_other_devices_get_the_steps_themselves():
    pieces = steps()
    assert engine_attention(pieces, torch.device("meta")) is pieces
    assert attention_route("cpu") != attention_route("cuda") != attention_route("meta")


class Module:
    def __init__(self, groups):
        self.num_key_value_groups, self.training = groups, False


def attention_inputs(batch, heads, kv_heads, length, queries, dtype, mask_kind, seed=0):
    """As a model's attention gets them: the query a transposed view of the projection's [B, q, heads, d], keys and
    values prefix views of a cache's buffers with spare columns."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, queries, heads, 16, generator=g, dtype=dtype).transpose(1, 2)
    key, value = (torch.randn(batch, kv_heads, length + 5, 16, generator=g, dtype=dtype)[:, :, :length]
                  for _ in range(2))
    attended = torch.rand(batch, 1, queries, length, generator=g) < 0.7
    attended[..., -1] = True  # every query sees something
    if mask_kind == "bool":
        return query, key, value, attended
    return query, key, value, torch.zeros(attended.shape, dtype=dtype).masked_fill(~attended, torch.finfo(dtype).min)


@pytest.mark.parametrize("batch,groups,length,queries,dtype,mask_kind", list(itertools.product(
    [1, 3], [2, 3], [5, 40, 300], [2, 7], [torch.float32, torch.float64, torch.bfloat16], ["bool", "additive"])))
def test_grouped_heads_in_the_kernel_give_transformers_sdpa_bit_for_bit(batch, groups, length, queries, dtype,
                                                                       mask_kind):
    query, key, value, mask = attention_inputs(batch, 2 * groups, 2, length, queries, dtype, mask_kind)

    def must_not_run(*args, **kwargs):
        raise AssertionError("a masked block of several queries with grouped heads is computed, not handed on")

    ours, _ = grouped_kv_sdpa(must_not_run, Module(groups), query, key, value, mask, scaling=0.25)
    theirs, _ = hf_sdpa.sdpa_attention_forward(Module(groups), query, key, value, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (batch, queries, 2 * groups, 16)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("case", ["one query", "no mask", "no groups", "softcap", "position bias"])
def test_everything_else_goes_to_the_function_it_replaced(case):
    groups = 1 if case == "no groups" else 2
    query, key, value, mask = attention_inputs(1, 2 * groups, 2, 9, 1 if case == "one query" else 3, torch.float32,
                                               "additive")
    kwargs = {"softcap": 30.0} if case == "softcap" else {}
    if case == "position bias":
        kwargs = {"position_bias": torch.zeros(1, 2 * groups, 3, 9)}
    handed = []
    result = grouped_kv_sdpa(lambda *args, **kw: handed.append(kw) or "replaced", Module(groups), query, key, value,
                             None if case == "no mask" else mask, **kwargs)
    assert result == "replaced" and len(handed) == 1


def test_installed_only_inside_and_never_over_a_users_own_sdpa():
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert original is hf_sdpa.sdpa_attention_forward
    with grouped_kv_in_kernel():
        inside = ALL_ATTENTION_FUNCTIONS["sdpa"]
        with grouped_kv_in_kernel():  # overlapping (another generator's step): installed once
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is inside
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is inside
    assert inside is not original and ALL_ATTENTION_FUNCTIONS["sdpa"] is original

    def users_sdpa(*args, **kwargs):
        return "user"

    ALL_ATTENTION_FUNCTIONS["sdpa"] = users_sdpa  # a user's local override: computes what the user says, always
    try:
        with grouped_kv_in_kernel():
            query, key, value, mask = attention_inputs(1, 4, 2, 9, 3, torch.float32, "additive")
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is users_sdpa
            assert ALL_ATTENTION_FUNCTIONS["sdpa"](Module(2), query, key, value, mask) == "user"
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is users_sdpa
    finally:
        del ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original


def test_each_resumption_runs_inside_and_the_caller_outside():
    seen = [(inside, ALL_ATTENTION_FUNCTIONS["sdpa"] is hf_sdpa.sdpa_attention_forward)
            for inside in each_resumption(
                (ALL_ATTENTION_FUNCTIONS["sdpa"] is hf_sdpa.sdpa_attention_forward for _ in range(3)),
                grouped_kv_in_kernel)]
    assert seen == [(False, True)] * 3


def test_the_engine_verifies_without_repeating_key_value_heads(monkeypatch):
    """A chain's verify forwards (several queries, a mask) on a model with grouped heads never call repeat_kv; the
    output is plain decoding's (float64 tiny model; the exactness suites cover every drafter and batches)."""
    model = tiny_model("llama")
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    repeated = []
    real_repeat = hf_sdpa.repeat_kv
    monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda *a: repeated.append(1) or real_repeat(*a))
    prompt = repetitive_prompt()
    expected = greedy_sequences(model, [prompt], 16)[0]
    engine = SelfSpecModel(model, drafter="ngram")  # (its wrap-time probes may repeat heads: not a verify forward)
    repeated.clear()
    out = engine.generate(prompt, max_new_tokens=16, num_draft_tokens=3, eos_token_id=[])
    assert_exercised(out.stats, what="n-gram chain on a model with grouped heads")
    assert not repeated
    assert torch.equal(out.sequences[0], expected)
