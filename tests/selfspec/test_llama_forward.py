"""The plain Llama forward's tensor operations: bit for bit the decoder's own forward on every shape the engine asks
(prefill, decode, chain block, tree mask, a batch's ragged rows, feature layers), built only where it is, and the
engine's tokens the same through it as through the decoder's forward (the oracle) for every drafter, chains, trees and
batches. (Over int8 products its layers run in the kernel instead: tests/selfspec/kernel/test_llama_layer.py.)"""
from __future__ import annotations

import pytest
import torch
import transformers
from transformers import DynamicCache

from selfspec import SelfSpecModel
from selfspec import llama_forward
from selfspec.attention_backends import additive_mask, engine_attention_context
from selfspec.hf_compat import cache_arg
from selfspec.llama_forward import LlamaForward
from selfspec.target import TargetModel
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.exercised import assert_exercised, greedy_sequences, scrambled_model, trained_heads


@pytest.fixture(params=["float64", "float32", "int8 Q4_1"])
def llama(request, tmp_path):
    if request.param != "int8 Q4_1":
        return tiny_model("llama", seed=4, dtype=getattr(torch, request.param))
    from selfspec.kernel import few_row_linear
    from selfspec.kernel.backends import use_backend
    from selfspec.loading import load_model
    from tests.selfspec.kernel.test_quantized import write_gguf

    if few_row_linear.unavailable_reason():
        pytest.skip(f"selfspec's kernel is unavailable: {few_row_linear.unavailable_reason()}")
    model = scrambled_model("llama", dtype=torch.float32, hidden=64, num_layers=2, vocab_size=256)
    write_gguf(model, tmp_path / "tiny.Q4_1.gguf", "Q4_1")
    kept = load_model(tmp_path / "tiny.Q4_1.gguf")
    use_backend(kept, "int8")
    return kept


def blocks(vocab: int):
    """(ids [B, n], 4D mask or None, positions or None) in the order the engine would send them to one cache."""
    ids = (torch.arange(40) * 11 + 5) % vocab
    yield ids[None, :6], None, None  # prefill
    yield ids[None, 6:7], None, None  # one-token decode
    yield ids[None, 7:11], None, None  # a chain's causal block
    # a tree of 4 nodes (root, two children of the root, a grandchild of the first) after 11 entries
    ancestors = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    visible = torch.cat([torch.ones(4, 11, dtype=torch.bool), ancestors], dim=1)
    yield ids[None, 11:15], additive_mask(visible, torch.float32)[None, None], torch.tensor([[11, 12, 12, 13]])


def test_the_plain_forward_is_the_decoders_bit_for_bit(llama):
    plain = LlamaForward.of(llama)
    assert plain is not None
    plain.kernel_layers = []  # (its tensor operations; the kernel's layers compute their own: test_llama_layer.py)
    decoder, dtype = llama.get_decoder(), TargetModel(llama).dtype
    ours, theirs = DynamicCache(config=llama.config), DynamicCache(config=llama.config)
    layers = (1, 0)  # (an order other than the layers')
    with torch.no_grad(), engine_attention_context(llama):
        for ids, mask, positions in blocks(llama.config.vocab_size):
            mask = None if mask is None else mask.to(dtype)
            got, features = plain(ids, ours, mask, positions, layers)
            expected = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, **cache_arg(theirs),
                               use_cache=True, output_hidden_states=True)
            assert torch.equal(got, expected.last_hidden_state)
            assert all(torch.equal(f, expected.hidden_states[layer]) for f, layer in zip(features, layers))
        for layer_ours, layer_theirs in zip(ours.layers, theirs.layers):
            assert torch.equal(layer_ours.keys, layer_theirs.keys)
            assert torch.equal(layer_ours.values, layer_theirs.values)


def test_a_batch_of_ragged_rows_is_the_decoders_bit_for_bit():
    model = tiny_model("llama", seed=5, dtype=torch.float32)
    plain = LlamaForward.of(model)
    ids = random_prompt(10, seed=3).repeat(2, 1)
    positions = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5, 6, 7], list(range(10))])  # row 0 left-padded by 3
    visible = torch.ones(2, 10, 10, dtype=torch.bool).tril()
    visible[0, :, :3] = False
    visible[0, :3, :3] = torch.eye(3, dtype=torch.bool)  # (padding sees itself: no empty softmax)
    mask = additive_mask(visible[:, None], torch.float32)
    ours, theirs = DynamicCache(config=model.config), DynamicCache(config=model.config)
    with torch.no_grad():
        got, _ = plain(ids, ours, mask, positions)
        expected = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions,
                                       **cache_arg(theirs), use_cache=True).last_hidden_state
    assert torch.equal(got, expected)


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma", "phi3", "gpt2"])
def test_other_families_keep_the_decoders_own_forward(family):
    model = tiny_model(family, seed=1)
    assert LlamaForward.of(model) is None
    assert TargetModel(model).plain_forward is None


def test_a_llama_with_biases_or_another_activation_keeps_the_decoders_forward():
    assert LlamaForward.of(tiny_model("llama", seed=1)) is not None
    for change in (dict(attention_bias=True), dict(mlp_bias=True), dict(hidden_act="gelu")):
        config = tiny_model("llama", seed=1).config
        for key, value in change.items():
            setattr(config, key, value)
        model = transformers.LlamaForCausalLM(config).double().eval()
        assert LlamaForward.of(model) is None, change


def test_the_probe_refuses_a_forward_that_differs_by_a_bit(monkeypatch):
    """Catches (planted): RMSNorm through torch's fused rms_norm, which rounds differently from LlamaRMSNorm's ops."""
    model = tiny_model("llama", seed=2, dtype=torch.float32)
    assert LlamaForward.of(model) is not None
    monkeypatch.setattr(llama_forward, "rms_norm", lambda norm, hidden: torch.nn.functional.rms_norm(
        hidden, hidden.shape[-1:], norm.weight, norm.variance_epsilon) * (1 + 1e-7))
    assert LlamaForward.of(model) is None


def test_the_engine_runs_the_plain_forward_and_gives_the_decoders_tokens(llama, monkeypatch):
    """Every drafter, chains and a tree, and a batch: the same tokens through the plain forward as through the
    decoder's own forward (`plain_forward = None`, the oracle), and no decoder call while decoding plainly."""
    vocab = llama.config.vocab_size
    prompts = [repetitive_prompt(20, vocab_size=vocab, period=4)] + [random_prompt(9, vocab_size=vocab, seed=s)
                                                                    for s in range(1, 4)]
    heads = trained_heads(llama, greedy_sequences(llama, prompts, 24), num_heads=3)
    calls = []  # the decoder's own forward, counted where the engine calls it (a hook would ask for the modules)
    real_decode = TargetModel.decode

    def counted_decode(target, *args, **kwargs):
        if target.plain_forward is None or target.plain_forward.runs_modules():
            calls.append(1)
        return real_decode(target, *args, **kwargs)

    monkeypatch.setattr(TargetModel, "decode", counted_decode)
    TargetModel(llama).plain_forward.kernel_layers = []  # (the kernel's layers: test_llama_layer.py)
    drafters = [dict(drafter="ngram"), dict(heads=heads), dict(heads=heads, tree_size=6),
                dict(drafter="early_exit", exit_layer=1)]
    try:
        for options in drafters:
            engine = SelfSpecModel(llama, **options)
            assert engine.target.plain_forward is not None
            calls.clear()
            fast = [engine.generate(p, max_new_tokens=24, num_draft_tokens=3, eos_token_id=[]) for p in prompts]
            assert not calls, options  # (the decoder's own forward never ran)
            engine.target.plain_forward = None
            oracle = [engine.generate(p, max_new_tokens=24, num_draft_tokens=3, eos_token_id=[]) for p in prompts]
            assert calls, options
            for a, b in zip(fast, oracle):
                assert torch.equal(a.sequences, b.sequences), options
            assert_exercised([o.stats for o in fast], what=str(options))
        engine = SelfSpecModel(llama, heads=heads)
        batch = torch.nn.utils.rnn.pad_sequence([p[0].flip(0) for p in prompts], batch_first=True,
                                                padding_value=2).flip(1)
        attention = torch.nn.utils.rnn.pad_sequence([torch.ones(p.shape[1], dtype=torch.long).flip(0) for p in prompts],
                                                    batch_first=True).flip(1)
        calls.clear()
        fast = engine.generate(batch, attention_mask=attention, max_new_tokens=16, num_draft_tokens=2, eos_token_id=[])
        assert not calls
        engine.target.plain_forward = None
        oracle = engine.generate(batch, attention_mask=attention, max_new_tokens=16, num_draft_tokens=2,
                                 eos_token_id=[])
        assert len(fast.sequences) == len(prompts)
        assert all(torch.equal(a, b) for a, b in zip(fast.sequences, oracle.sequences))
    finally:
        monkeypatch.undo()


def test_hooks_and_replaced_forwards_make_the_engine_call_the_modules():
    """A hook that changes a layer's output is part of the model: greedy tokens follow it (the decoder's own forward
    runs while it is registered), and the plain forward comes back once it is removed. Catches (planted): the plain
    forward ignoring hooks (the steered tokens would be the unhooked model's)."""
    model = tiny_model("llama", seed=7)
    prompt = random_prompt(8, seed=2)
    engine = SelfSpecModel(model, drafter="none")  # (which forward runs, not drafting, is under test)
    plain = engine.generate(prompt, max_new_tokens=12, eos_token_id=[]).sequences
    assert not engine.target.plain_forward.runs_modules()
    steer = model.get_decoder().norm.register_forward_hook(lambda module, args, out: -out)  # (argmax -> argmin)
    try:
        assert engine.target.plain_forward.runs_modules()
        steered = engine.generate(prompt, max_new_tokens=12, eos_token_id=[]).sequences
        expected = greedy_sequences(model, [prompt], 12)[0]  # (the hooked model's own greedy tokens)
    finally:
        steer.remove()
    assert torch.equal(steered[0], expected) and not torch.equal(steered, plain)
    assert not engine.target.plain_forward.runs_modules()
    norm = model.get_decoder().norm
    norm.forward = lambda hidden: hidden  # (a replaced forward, not a hook)
    try:
        assert engine.target.plain_forward.runs_modules()
    finally:
        del norm.forward
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert engine.target.plain_forward.runs_modules()  # (a global hook)
    finally:
        handle.remove()
