"""The quantized products (and an embedding's lookup) as registered ops: a compiled forward (fullgraph: no graph break)
computes what the eager layer computes, bit for bit, for both backends, and the op's fake gives the output's shape."""
import pytest
import torch

from selfspec.kernel import quantized as q


@pytest.mark.parametrize("backend", ["float", "int8"])
@pytest.mark.parametrize("qtype", list(q.TYPES))
def test_a_compiled_layer_is_the_eager_layer(needs_kernel, backend, qtype):
    torch._dynamo.reset()
    layer = q.QuantizedLinear(q.random_weight(qtype, 40, 96, seed=1), torch.randn(40), backend=backend)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=False)
    for rows in (1, 4, 40):
        x = torch.randn(rows, 3, 96, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(compiled(x), layer(x)), rows


def test_inductor_compiles_a_stack_of_quantized_layers(needs_kernel):
    """The CPU backend a compiled step would use: the products stay the kernel's, the code around them is generated."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(q.QuantizedLinear(q.random_weight("Q4_1", 64, 96, seed=2), backend="int8"),
                                torch.nn.SiLU(), q.QuantizedLinear(q.random_weight("Q8_0", 32, 64, seed=3)))
    x = torch.randn(2, 96)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x), model(x))


def test_the_op_says_its_output_shape_without_running(needs_kernel):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from selfspec.kernel.ops import quantized_linear

    weight = q.random_weight("Q4_0", 24, 64)
    with FakeTensorMode() as mode:
        x, blocks = mode.from_tensor(torch.randn(5, 2, 64)), mode.from_tensor(weight.blocks)
        assert quantized_linear(x, blocks, weight.qtype, 64, False).shape == (5, 2, 24)


@pytest.mark.parametrize("interleaved", [False, True])
def test_a_compiled_embedding_lookup_is_the_eager_one(needs_kernel, interleaved):
    torch._dynamo.reset()
    weight = q.random_weight("Q8_0", 48, 64, seed=4)
    weight.set_interleaved(interleaved)
    embedding = q.QuantizedEmbedding(weight)
    ids = torch.tensor([[3, 47, 0], [9, 9, 12]])
    compiled = torch.compile(embedding, fullgraph=True, backend="aot_eager", dynamic=False)
    assert torch.equal(compiled(ids), embedding(ids)) and compiled(ids).shape == (2, 3, 64)
