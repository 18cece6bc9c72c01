"""The kernel's Llama layers (`selfspec/kernel/llama_layer.py`): taken for every forward of a plain Llama whose products
all run on the int8 backend; each row computed alone (a causal block, one-token decodes, a batch's rows and any thread
count give the same bits); close to the decoder's own forward over the same products (the same model, other float
rounding); the engine's tokens through them the same with every drafter, chains, trees and batches as with speculation
off. Needs the kernel (x86 with AVX2)."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from selfspec import SelfSpecModel
from selfspec.attention_backends import engine_attention_context
from selfspec.hf_compat import cache_arg
from selfspec.kernel import backends
from selfspec.kernel.llama_layer import KernelLayer
from selfspec.loading import load_model
from selfspec.target import TargetModel
from tests.conftest import random_prompt, repetitive_prompt
from tests.selfspec.exercised import assert_exercised, greedy_sequences, scrambled_model, trained_heads


def _int8_llama(qtype: str, directory):
    from tests.selfspec.kernel.test_quantized import tiny_gguf_file, write_gguf

    if qtype == "mixed":  # (as a Q4_K_M file: one layer's products of several types)
        path = directory / "tiny.mixed.gguf"
        model = scrambled_model("llama", dtype=torch.float32, hidden=64, num_layers=2, vocab_size=256)
        model.config.tie_word_embeddings = True
        write_gguf(model, path, "Q4_1", types={"attn_v": "Q8_0", "ffn_up": "Q4_0", "ffn_down": "Q5_0"})
    else:
        path = tiny_gguf_file(qtype, directory)
    model = load_model(path)
    backends.use_backend(model, "int8")
    layer = model.model.layers[0]
    kinds = {linear.weight.name for linear in (layer.self_attn.v_proj, layer.mlp.up_proj, layer.mlp.down_proj)}
    assert len(kinds) == (3 if qtype == "mixed" else 1)
    return model


@pytest.fixture(params=["Q4_1", "Q8_0", "Q6_K", "mixed"])
def int8_llama(request, tmp_path, needs_kernel):
    return _int8_llama(request.param, tmp_path)


# (types whose tiny models' drafts are sometimes accepted and sometimes rejected by every drafter here)
@pytest.fixture(params=["Q4_1", "Q4_0"])
def drafting_llama(request, tmp_path, needs_kernel):
    return _int8_llama(request.param, tmp_path)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The number of layers the kernel has run (a list, one entry a layer)."""
    calls, real = [], KernelLayer.attention_in

    def counted(layer, *args):
        calls.append(1)
        return real(layer, *args)

    monkeypatch.setattr(KernelLayer, "attention_in", counted)
    return calls


def states(model, blocks, batch: int = 1) -> list[torch.Tensor]:
    """Final states of each [n] block of ids sent in turn to one cache (the same ids in `batch` rows)."""
    plain, cache = TargetModel(model).plain_forward, DynamicCache(config=model.config)
    with torch.no_grad(), engine_attention_context(model):
        return [plain(ids.expand(batch, -1), cache)[0] for ids in blocks]


def test_every_layer_runs_in_the_kernel_and_each_row_alone(int8_llama, kernel_calls):
    """A block of 4 tokens, the same 4 decoded one at a time, two rows of a batch and two threads: the same bits."""
    plain = TargetModel(int8_llama).plain_forward
    assert plain.kernel_layers and all(layer is not None and layer.active() for layer in plain.kernel_layers)
    ids = (torch.arange(10) * 11 + 5) % int8_llama.config.vocab_size
    block = states(int8_llama, [ids[:6], ids[6:]])[1][0]  # [4, hidden]
    assert kernel_calls and len(kernel_calls) == 2 * int8_llama.config.num_hidden_layers
    one_by_one = torch.cat([s[0] for s in states(int8_llama, [ids[:6]] + [ids[i: i + 1] for i in range(6, 10)])[1:]])
    assert torch.equal(block, one_by_one)
    batched = states(int8_llama, [ids[:6], ids[6:]], batch=2)[1]
    assert torch.equal(batched[0], block) and torch.equal(batched[1], block)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(states(int8_llama, [ids[:6], ids[6:]])[1][0], block)
    finally:
        torch.set_num_threads(threads)


def test_every_build_and_int8_path_computes_the_same_layers(int8_llama, monkeypatch):
    """The AVX2 build (what an AVX2-only CPU runs; a CPU with AVX-512 builds it too for this) and each int8 path this
    CPU has (scalar, AVX2, AVX-512 VNNI): the same states bit for bit, so no path leans on the build's own flags."""
    from selfspec.kernel import few_row_linear, int8

    ids = (torch.arange(10) * 11 + 5) % int8_llama.config.vocab_size
    expected = states(int8_llama, [ids[:6], ids[6:]])[1]
    builds = [None] + (["avx2"] if few_row_linear.kernel_isa() == "avx512" else [])
    for isa in builds:
        for path in int8.int8_paths():
            monkeypatch.setattr(KernelLayer, "isa", isa)
            monkeypatch.setattr(KernelLayer, "path", path)
            assert torch.equal(states(int8_llama, [ids[:6], ids[6:]])[1], expected), (isa, path)


def _distance_to_decoder(model) -> float:
    """The largest difference between the kernel's final states and the decoder's own forward over the same products,
    relative to the states' largest magnitude (a prefill, then a block of 3)."""
    ids = (torch.arange(9) * 7 + 3)[None] % model.config.vocab_size
    ours, theirs = DynamicCache(config=model.config), DynamicCache(config=model.config)
    plain, decoder, worst = TargetModel(model).plain_forward, model.get_decoder(), 0.0
    with torch.no_grad(), engine_attention_context(model):
        for block in (ids[:, :6], ids[:, 6:]):
            got = plain(block, ours)[0]
            expected = decoder(input_ids=block, **cache_arg(theirs), use_cache=True).last_hidden_state
            worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
    return worst


def test_the_kernels_layers_compute_the_decoders_function(int8_llama, monkeypatch):
    """Close to the decoder's forward (its own norms, rotary and SiLU in PyTorch's rounding; int8 rounding of
    activations can turn an ulp into a step, hence a tolerance). Catches (planted): rotary with cos and sin swapped."""
    assert _distance_to_decoder(int8_llama) < 0.02
    real = KernelLayer.attention_in
    monkeypatch.setattr(KernelLayer, "attention_in", lambda layer, hidden, cos, sin: real(layer, hidden, sin, cos))
    assert _distance_to_decoder(int8_llama) > 0.05


def test_drafting_through_the_kernels_layers_is_exact(drafting_llama, kernel_calls):
    """Every drafter (n-gram, Medusa heads in chains and a tree, early exit sharing its layers' work) and a batch: the
    same greedy tokens as speculation off through the same layers; drafts proposed, accepted and rejected."""
    vocab = drafting_llama.config.vocab_size
    prompts = [repetitive_prompt(20, vocab_size=vocab, period=4)] + [random_prompt(9, vocab_size=vocab, seed=s)
                                                                    for s in range(1, 4)]
    off = SelfSpecModel(drafting_llama, drafter="none")
    expected = [off.generate(p, max_new_tokens=24, eos_token_id=[]).sequences for p in prompts]
    assert kernel_calls
    heads = trained_heads(drafting_llama, greedy_sequences(drafting_llama, prompts, 24), num_heads=3)
    for options in (dict(drafter="ngram"), dict(heads=heads), dict(heads=heads, tree_size=6),
                    dict(drafter="early_exit", exit_layer=1)):
        engine = SelfSpecModel(drafting_llama, **options)
        outs = [engine.generate(p, max_new_tokens=24, num_draft_tokens=3, eos_token_id=[]) for p in prompts]
        assert all(torch.equal(out.sequences, tokens) for out, tokens in zip(outs, expected)), options
        assert_exercised([out.stats for out in outs], what=str(options))
    batch = torch.nn.utils.rnn.pad_sequence([p[0].flip(0) for p in prompts], batch_first=True, padding_value=2).flip(1)
    attention = torch.nn.utils.rnn.pad_sequence([torch.ones(p.shape[1], dtype=torch.long) for p in prompts],
                                                batch_first=True).flip(1)
    engine = SelfSpecModel(drafting_llama, heads=heads)
    out = engine.generate(batch, attention_mask=attention, max_new_tokens=16, num_draft_tokens=2, eos_token_id=[])
    assert all(torch.equal(row, tokens[0, : row.shape[0]]) for row, tokens in zip(out.sequences, expected))
