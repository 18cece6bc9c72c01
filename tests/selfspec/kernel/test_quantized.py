"""Weights kept as GGUF blocks: the kernel's products equal gguf's numpy dequantizer's weights multiplied out (to float32
rounding), rows independent of their neighbours; a tiny Llama written to a GGUF file loads with its linears and tied
embedding quantized, in about the blocks' bytes, and the engine's greedy output with them is the dequantized model's
own `generate`, drafts proposed, accepted and rejected."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selfspec import SelfSpecModel
from selfspec.drafters.base import weight_share
from selfspec.kernel import few_row_linear as frl
from selfspec.kernel import reblock
from selfspec.kernel import quantized as q
from selfspec.loading import load_model, plain_copy
from tests.conftest import random_prompt, repetitive_prompt
from tests.selfspec.exercised import assert_exercised, scrambled_model
from tests.selfspec.kernel import k_quant_blocks

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType, quants  # noqa: E402

TYPES = list(q.TYPES)
K_QUANTS = tuple(reblock.SUPER_BLOCK_BYTES)  # (kept re-blocked into blocks of 32)


def file_blocks(weights: np.ndarray, qtype: str) -> np.ndarray:
    """The GGUF file's bytes of `weights` [n, k] quantized to `qtype` (gguf's quantizer; ours for K-quants)."""
    if qtype in K_QUANTS:
        return k_quant_blocks.quantize(weights, qtype)
    return quants.quantize(weights, GGMLQuantizationType[qtype])


def quantized_weight(qtype: str, n_dim: int, k_dim: int, seed: int = 0):
    """(QuantizedWeight, [n, k] float32 weights as gguf's dequantizer gives them) of random weights. A K-quant's rows
    are whole super-blocks of 256 in the file: quantized at the next multiple of 256, then re-blocked (`reblock`) and
    cut to k_dim (its blocks of 32 stand alone)."""
    padded = -(-k_dim // reblock.SUPER_WEIGHTS) * reblock.SUPER_WEIGHTS if qtype in K_QUANTS else k_dim
    weights = np.random.default_rng(seed).standard_normal((n_dim, padded)).astype(np.float32)
    blocks = file_blocks(weights, qtype)
    reference = torch.from_numpy(quants.dequantize(blocks, GGMLQuantizationType[qtype]).astype(np.float32))
    blocks = torch.from_numpy(blocks.copy())
    if qtype in K_QUANTS:
        blocks = reblock.reblocked(qtype, blocks)
    row_bytes = k_dim // q.BLOCK_WEIGHTS * q.BLOCK_BYTES[q.TYPES[qtype]]
    return q.QuantizedWeight(blocks[:, :row_bytes].contiguous(), qtype, k_dim), reference[:, :k_dim].contiguous()


def test_block_sizes_are_ggufs():
    for name, code in q.TYPES.items():
        assert GGMLQuantizationType[name] == code
        count, size = q.BLOCK_SCALES[code]
        if name in K_QUANTS:  # the file's super-blocks; kept re-blocked: two float32 scales a block
            assert gguf.GGML_QUANT_SIZES[GGMLQuantizationType[name]] == (reblock.SUPER_WEIGHTS,
                                                                          reblock.SUPER_BLOCK_BYTES[name])
            assert (count, size) == (2, 4) and q.BLOCK_BYTES[code] == 8 + (16 if name == "Q4_K" else 32)
        else:
            assert gguf.GGML_QUANT_SIZES[GGMLQuantizationType[name]] == (q.BLOCK_WEIGHTS, q.BLOCK_BYTES[code])
            assert size == 2 and q.BLOCK_BYTES[code] == (2 * count + q.FIFTH_BITS.get(code, 0)
                                                          + (32 if name == "Q8_0" else 16))


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_k_quants_reblock_to_ggufs_weights_and_refuse_other_bytes(needs_kernel, qtype):
    """Whole super-blocks of every byte value (scales included: gguf's test files are llama.cpp's, ours random) ->
    the kept blocks dequantize to gguf's weights bit for bit."""
    size, generator = reblock.SUPER_BLOCK_BYTES[qtype], torch.Generator().manual_seed(7)
    data = torch.randint(0, 256, (9, 3, size), dtype=torch.uint8, generator=generator)
    halves = slice(0, 4) if qtype == "Q4_K" else slice(208, 210)  # the float16 scales: finite, either sign
    scales = (torch.rand(9, 3, 2 if qtype == "Q4_K" else 1, generator=generator) - 0.5) * 0.02
    data[..., halves] = scales.to(torch.float16).view(torch.uint8).reshape(9, 3, -1)
    data = data.reshape(9, -1)
    reference = torch.from_numpy(quants.dequantize(data.numpy(), GGMLQuantizationType[qtype]).astype(np.float32))
    weight = q.QuantizedWeight(reblock.reblocked(qtype, data), qtype, 3 * reblock.SUPER_WEIGHTS)
    assert torch.equal(weight.dequantize(), reference.reshape(9, -1))
    planted = data.clone()
    planted[0, 4 if qtype == "Q4_K" else 192] ^= 1  # one sub-block's scale
    assert not torch.equal(q.QuantizedWeight(reblock.reblocked(qtype, planted), qtype, 768).dequantize(),
                           weight.dequantize())
    with pytest.raises(ValueError, match="whole blocks"):
        reblock.reblocked(qtype, data[:, :-1])
    with pytest.raises(ValueError, match="re-blocks only"):
        reblock.reblocked("Q5_K", data)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n_dim, k_dim", [(1, 32), (7, 96), (37, 608), (5, 1536)])
def test_dequantized_rows_are_ggufs_bit_for_bit(needs_kernel, qtype, n_dim, k_dim):
    weight, reference = quantized_weight(qtype, n_dim, k_dim, seed=n_dim)
    assert torch.equal(weight.dequantize(), reference)
    ids = torch.tensor([n_dim - 1, 0, n_dim // 2])
    assert torch.equal(weight[ids], reference[ids])
    with pytest.raises(IndexError, match="row ids"):
        weight[torch.tensor([n_dim])]


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 16, 31, 32, 33, 70])
@pytest.mark.parametrize("n_dim, k_dim", [(1, 32), (7, 96), (37, 608), (66, 160)])
def test_kernel_computes_the_dequantized_product(needs_kernel, qtype, rows, n_dim, k_dim):
    weight, reference = quantized_weight(qtype, n_dim, k_dim, seed=rows + n_dim)
    layer = q.QuantizedLinear(weight, backend="float")
    x = torch.randn(rows, k_dim, generator=torch.Generator().manual_seed(rows))
    y = layer(x)
    exact = x.double() @ reference.double().T
    assert y.shape == (rows, n_dim) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5 * k_dim ** 0.5)
    if rows <= q.MAX_ROWS:  # the kernel: each row the same sums as alone, and as the float32 kernel's
        assert torch.equal(layer(x[-1:])[0], y[-1])
        assert torch.equal(frl.few_row_linear(x, reference), y)


def test_planted_bug_in_the_blocks_is_caught(needs_kernel):
    # the product check above would fail for a weight one block off: a wrong scale in the first block
    weight, reference = quantized_weight("Q4_1", 4, 64)
    weight.blocks[0, 0] ^= 0x40
    assert not torch.equal(weight.dequantize(), reference)


def test_more_rows_a_gradient_and_other_dtypes_take_the_dequantized_chunks(needs_kernel, monkeypatch):
    weight, reference = quantized_weight("Q8_0", 40, 64)
    monkeypatch.setattr(q, "CHUNK_WEIGHTS", 64 * 16)  # 16 rows a chunk: three chunks
    layer = q.QuantizedLinear(weight, bias=torch.randn(40), backend="float")
    x = torch.randn(3, 50, 64, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    torch.testing.assert_close(y, F.linear(x, reference.double(), layer.bias.double()))
    y.sum().backward()
    torch.testing.assert_close(x.grad, reference.double().sum(0).expand_as(x))


def test_a_quantized_weight_reads_like_the_float_weight(needs_kernel):
    weight, reference = quantized_weight("Q4_0", 12, 64)
    assert weight.shape == reference.shape and weight.dtype == torch.float32 and weight.device.type == "cpu"
    assert weight.numel() == reference.numel() and weight.detach() is weight
    assert torch.equal(weight[2:5], reference[2:5]) and torch.equal(torch.mul(weight, 2), reference * 2)
    assert torch.equal(weight.sum(0), reference.sum(0))
    with pytest.raises(ValueError, match="keeps only"):
        q.QuantizedWeight(weight.blocks, "Q5_K", 64)
    with pytest.raises(ValueError, match="bytes"):
        q.QuantizedWeight(weight.blocks[:, :-1].contiguous(), "Q4_0", 64)


def write_gguf(model, path, qtype: str, types: dict[str, str] | None = None) -> None:
    """`model` (a tiny float32 Llama, tied embeddings) as llama.cpp writes a GGUF file: q / k rows permuted, its
    linears and token embedding quantized to `qtype` (types: another type for some tensors by their GGUF name's kind,
    e.g. {"attn_v": "Q8_0"}, as a Q4_K_M file mixes them), norms float32."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"])
    writer.add_vocab_size(config.vocab_size)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)

    def permuted(weight, heads):  # llama.cpp's order of q / k rows (transformers reverses it)
        return weight.reshape(heads, 2, weight.shape[0] // heads // 2, -1).transpose(1, 2).reshape(weight.shape)

    def add(name, weight, quantize=True):
        weight = weight.detach().float().numpy()
        if quantize:
            kind = (types or {}).get(name.split(".")[-2], qtype)
            writer.add_tensor(name, file_blocks(weight, kind), raw_dtype=GGMLQuantizationType[kind])
        else:
            writer.add_tensor(name, weight)

    add("token_embd.weight", model.model.embed_tokens.weight)
    add("output_norm.weight", model.model.norm.weight, quantize=False)
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        add(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight, quantize=False)
        add(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight, quantize=False)
        add(f"blk.{i}.attn_q.weight", permuted(attn.q_proj.weight, config.num_attention_heads))
        add(f"blk.{i}.attn_k.weight", permuted(attn.k_proj.weight, config.num_key_value_heads))
        add(f"blk.{i}.attn_v.weight", attn.v_proj.weight)
        add(f"blk.{i}.attn_output.weight", attn.o_proj.weight)
        add(f"blk.{i}.ffn_gate.weight", mlp.gate_proj.weight)
        add(f"blk.{i}.ffn_up.weight", mlp.up_proj.weight)
        add(f"blk.{i}.ffn_down.weight", mlp.down_proj.weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_gguf_file(qtype: str, directory) -> str:
    """A tiny scrambled Llama (tied embeddings) written as a GGUF file of `qtype` (K-quants: rows of 256 weights, and
    less noise: at 0.2 that width never repeats itself, so n-gram drafts were never accepted)."""
    wide = qtype in K_QUANTS
    model = scrambled_model("llama", dtype=torch.float32, hidden=256 if wide else 64, noise=0.05 if wide else 0.2,
                            num_layers=2, vocab_size=256)
    model.config.tie_word_embeddings = True
    path = directory / f"tiny.{qtype}.gguf"
    write_gguf(model, path, qtype)
    return path


@pytest.fixture(params=TYPES)
def gguf_file(request, tmp_path):
    return tiny_gguf_file(request.param, tmp_path)


def test_a_gguf_llama_generates_the_dequantized_models_tokens(needs_kernel, gguf_file):
    dequantized = load_model(gguf_file, quantized="dequantize")
    kept = load_model(gguf_file, quantized="keep", quantized_backend="float")  # (the int8 backend rounds x)
    linears = [m for m in kept.modules() if isinstance(m, q.QuantizedLinear)]
    assert len(linears) == 7 * kept.config.num_hidden_layers + 1  # every decoder linear and the LM head
    assert isinstance(kept.get_input_embeddings(), q.QuantizedEmbedding)
    assert not any(type(m) is torch.nn.Linear for m in kept.modules())
    for name, module in kept.named_modules():  # each kept weight is the dequantized model's, bit for bit
        if isinstance(module, (q.QuantizedLinear, q.QuantizedEmbedding)):
            assert torch.equal(module.weight.dequantize(), dequantized.get_submodule(name).weight)
    assert weight_share(kept, [kept.lm_head]) == pytest.approx(weight_share(dequantized, [dequantized.lm_head]))
    engine = SelfSpecModel(kept, drafter="ngram")
    stats = []
    for prompt in [repetitive_prompt(20, vocab_size=256, period=4), random_prompt(12, vocab_size=256, seed=1),
                   random_prompt(7, vocab_size=256, seed=2)]:
        with torch.no_grad():
            expected = dequantized.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                                            pad_token_id=2)[0]
        out = engine.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences[0], expected)
        stats.append(out.stats)
    assert_exercised(stats)
    assert torch.equal(plain_copy(kept).lm_head.weight, dequantized.lm_head.weight)


def test_resident_weights_are_about_the_blocks_bytes(needs_kernel, gguf_file):
    kept, dequantized = load_model(gguf_file), load_model(gguf_file, quantized="dequantize")
    blocks = sum(w.blocks.numel() for w in q.quantized_weights(kept))
    norms = sum(p.numel() * 4 for p in kept.parameters())
    assert q.resident_bytes(kept) == blocks + norms + sum(b.numel() * b.element_size() for b in kept.buffers()
                                                           if b.dtype != torch.uint8)
    assert q.resident_bytes(kept) < 0.4 * q.resident_bytes(dequantized)  # Q8_0: 8.5 of 32 bits, plus norms


def test_keep_refuses_what_it_cannot_keep(needs_kernel, gguf_file, tmp_path):
    with pytest.raises(ValueError, match="float32 on a CPU"):
        load_model(gguf_file, dtype=torch.float64, quantized="keep")
    assert not q.quantized_weights(load_model(gguf_file, dtype=torch.float64))  # auto: dequantized
    with pytest.raises(ValueError, match="not one"):
        load_model(tmp_path, quantized="keep")
    with pytest.raises(ValueError, match="expected one of"):
        load_model(gguf_file, quantized="yes")


def test_auto_drafts_chains_over_kept_blocks_and_trees_when_asked(needs_kernel, gguf_file):
    """tree_size="auto" over quantized blocks: chains, saying why (trees measured slower there); an explicit size still
    drafts trees, and the dequantized model keeps "auto" trees. Planted bug caught: without the quantized check the
    kept model drafted trees of 10."""
    from heads.eagle import EagleHead
    from selfspec.tree.forward import QUANTIZED_CHAINS

    kept, dequantized = load_model(gguf_file), load_model(gguf_file, quantized="dequantize")
    spec = SelfSpecModel(kept, heads=EagleHead.for_model(kept).eval())
    assert spec.tree_size == 0 and spec.chain_reason == QUANTIZED_CHAINS
    assert SelfSpecModel(kept, heads=EagleHead.for_model(kept).eval(), tree_size=4).tree_size == 4
    assert SelfSpecModel(dequantized, heads=EagleHead.for_model(dequantized).eval()).tree_size > 0
