"""The kernel's attention in one fixed order: PyTorch's attention's values (to float32 rounding) for causal blocks,
masks and grouped heads, and each query's output the same bits whether computed alone over its prefix, in a causal
block, or beside keys it does not see (a batch's gap, a tree's other branches); the engine takes it exactly where its
products round activations to int8."""
import pytest
import torch
import torch.nn.functional as F

from selfspec.kernel.attention import ordered_attention, ordered_sdpa


def tensors(B=2, H=6, Hkv=2, W=5, L=40, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, W, D, generator=g), torch.randn(B, Hkv, L, D, generator=g) * 2,
            torch.randn(B, Hkv, L, D, generator=g))


def reference(q, k, v, visible):
    """PyTorch's attention over the grouped heads repeated, visible [B, W, L] bool."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None]).transpose(1, 2)


def causal(B, W, L):
    return (torch.arange(L)[None, :] < (L - W + torch.arange(W)[:, None] + 1)).expand(B, W, L)


def test_it_computes_attention(needs_kernel):
    q, k, v = tensors()
    B, _, W, D = q.shape
    L = k.shape[2]
    torch.testing.assert_close(ordered_attention(q, k, v, None, D ** -0.5), reference(q, k, v, causal(B, W, L)),
                               rtol=1e-5, atol=1e-5)
    visible = torch.rand(B, W, L, generator=torch.Generator().manual_seed(1)) < 0.6
    visible[..., 0] = True
    torch.testing.assert_close(ordered_attention(q, k, v, visible, D ** -0.5), reference(q, k, v, visible),
                               rtol=1e-5, atol=1e-5)


def test_a_querys_output_does_not_depend_on_the_queries_beside_it(needs_kernel):
    q, k, v = tensors(B=1, W=6, L=50, D=64, H=9, Hkv=3, seed=2)
    W, L, scale = q.shape[2], k.shape[2], 0.125
    block = ordered_attention(q, k, v, None, scale)  # [1, W, H, D]
    for i in range(W):
        seen = L - W + i + 1
        alone = ordered_attention(q[:, :, i:i + 1], k[:, :, :seen], v[:, :, :seen], None, scale)
        assert torch.equal(alone[:, 0], block[:, i]), i
    # beside keys it does not see: a gap of other entries between its prefix and its own (a batch row, a tree branch)
    gap = torch.randn(1, 3, 7, 64)
    keys, values = torch.cat([k[:, :, :44], gap, k[:, :, 44:]], dim=2), torch.cat([v[:, :, :44], gap, v[:, :, 44:]], 2)
    visible = torch.ones(1, W, L + 7, dtype=torch.bool)
    visible[:, :, 44:51] = False
    visible[0, :, 51:] = torch.arange(6)[None, :] <= torch.arange(6)[:, None]
    assert torch.equal(ordered_attention(q, keys, values, visible, scale), block)


def test_strided_caches_are_read_in_place(needs_kernel):
    q, k, v = tensors(W=1, L=30)
    buffer_k, buffer_v = torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16)  # an append-in-place layer's capacity
    buffer_k[:, :, :30], buffer_v[:, :, :30] = k, v
    assert torch.equal(ordered_attention(q, buffer_k[:, :, :30], buffer_v[:, :, :30], None, 0.25),
                       ordered_attention(q, k, v, None, 0.25))


def test_the_transformers_entry_takes_masks_and_leaves_biases_to_pytorch(needs_kernel):
    q, k, v = tensors(W=3, L=20)
    module = torch.nn.Module()
    additive = torch.zeros(2, 1, 3, 20).masked_fill_(~causal(2, 3, 20)[:, None], torch.finfo(torch.float32).min)
    out, weights = ordered_sdpa(module, q, k, v, additive, scaling=0.25)
    assert weights is None and torch.equal(out, ordered_attention(q, k, v, None, 0.25))
    assert ordered_sdpa(module, q, k, v, additive + 0.5, scaling=0.25) is None  # a bias, not a mask
    assert ordered_sdpa(module, q, k, v, additive, dropout=0.1) is None
    assert ordered_sdpa(module, q.double(), k.double(), v.double(), None) is None
    with pytest.raises(ValueError, match="head_dim"):
        ordered_attention(q[..., :12], k[..., :12], v[..., :12], None, 0.25)


def test_the_engine_orders_attention_exactly_over_int8_products(needs_kernel, tmp_path):
    from selfspec import SelfSpecModel
    from selfspec.kernel.backends import use_backend
    from selfspec.loading import load_model
    from tests.selfspec.exercised import scrambled_model
    from tests.selfspec.kernel.test_quantized import write_gguf

    model = scrambled_model("llama", dtype=torch.float32, hidden=64, num_layers=2, vocab_size=256)
    path = tmp_path / "tiny.Q8_0.gguf"
    write_gguf(model, path, "Q8_0")
    kept = load_model(path, quantized_backend="float")
    assert not SelfSpecModel(kept, drafter="ngram").ordered_attention
    use_backend(kept, "int8")
    assert SelfSpecModel(kept, drafter="ngram").ordered_attention
    assert not SelfSpecModel(model, drafter="ngram").ordered_attention  # float32 weights: PyTorch's attention
