"""The int8 backend of GGUF blocks (activations rounded to int8 per block, integer dot products): every code path the
CPU has equals a naive torch reference of that arithmetic bit for bit, each row is independent of the rows beside it,
"auto" picks a backend by measurement and keeps it, and the engine stays exact over it (ngram and Medusa drafts give
the same backend's plain greedy tokens, drafts proposed, accepted and rejected)."""
import pytest
import torch

from selfspec import SelfSpecModel
from selfspec.kernel import backends, int8
from selfspec.kernel import quantized as q
from selfspec.loading import load_model
from tests.conftest import random_prompt, repetitive_prompt
from tests.selfspec.exercised import assert_exercised, greedy_sequences, trained_heads

TYPES = list(q.TYPES)
SHAPES = [(1, 32), (7, 96), (37, 608), (66, 160)]


def int8_reference(x: torch.Tensor, weight: q.QuantizedWeight) -> torch.Tensor:
    """[rows, n] the int8 backend's result, written out naively: x [rows, k] rounded per block of 32 to int8 (scale
    max |x| / 127, x * (1 / scale) rounded half to even), each block's 32 products summed exactly, and block after
    block acc = fma(float(block sum), weight scale * x scale, acc) (Q6_K: per half-block of 16, with its own scale,
    the first half first); for Q4_1 and Q4_K also macc = fma(block min, x scale * sum of x's integers, macc), added at
    the end. (The fused multiply-add is emulated in float64: the product is exact
    there, and the sum's rounding before float32's differs from one rounding only on a float32 tie, ~2^-28 a step.)"""
    n_dim, k_dim = weight.shape
    rows, blocks = x.shape[0], k_dim // q.BLOCK_WEIGHTS
    file_bytes = int8.deinterleave(weight.blocks, weight.qtype) if weight.interleaved else weight.blocks
    raw = file_bytes.view(n_dim, blocks, q.BLOCK_BYTES[weight.qtype])
    count, size = q.BLOCK_SCALES[weight.qtype]
    scale_type = torch.float16 if size == 2 else torch.float32
    scale = lambda i: raw[..., i * size:(i + 1) * size].contiguous().view(scale_type).float()[..., 0]  # noqa: E731
    scale_w, header = scale(0), sum(q.header_fields(weight.qtype))  # [n, blocks]
    if weight.name in ("Q8_0", "Q6_K"):
        integers = raw[..., header:].contiguous().view(torch.int8).long()  # [n, blocks, 32]
    else:
        nibbles = raw[..., header:]
        integers = torch.cat([nibbles & 15, nibbles >> 4], dim=-1).long() - (8 if weight.name == "Q4_0" else 0)
        if weight.name == "Q5_0":  # bit j of the block's little-endian word after d: weight j's fifth bit
            word = raw[..., 2:6].long()
            word = word[..., 0] | word[..., 1] << 8 | word[..., 2] << 16 | word[..., 3] << 24  # [n, blocks]
            integers = integers + 16 * (word[..., None] >> torch.arange(32) & 1) - 16
    x_blocks = x.view(rows, blocks, q.BLOCK_WEIGHTS)
    scale_x = x_blocks.abs().amax(-1) / 127  # [rows, blocks]
    inverse = torch.where(scale_x != 0, 1 / scale_x, torch.zeros(()))
    x_ints = torch.round(x_blocks * inverse[..., None]).clamp(-127, 127).long()
    products = x_ints[:, None] * integers[None]  # [rows, n, blocks, 32], exact
    scales = scale_w[None] * scale_x[:, None]  # [rows, n, blocks], float32 products

    def fma(a, b, c):
        return (a.double() * b.double() + c.double()).float()
    acc = torch.zeros(rows, n_dim)
    if weight.name == "Q6_K":  # two half-blocks of 16, each its own scale: the first half's fma, then the second's
        second = scale(1)[None] * scale_x[:, None]
        for b in range(blocks):
            acc = fma(products[:, :, b, :16].sum(-1).float(), scales[:, :, b], acc)
            acc = fma(products[:, :, b, 16:].sum(-1).float(), second[:, :, b], acc)
        return acc
    sums = products.sum(-1)
    for b in range(blocks):
        acc = fma(sums[:, :, b].float(), scales[:, :, b], acc)
    if weight.name in ("Q4_1", "Q4_K"):
        sums_x, mins, total = scale_x * x_ints.sum(-1).float(), scale(1), torch.zeros(rows, n_dim)
        for b in range(blocks):
            total = fma(mins[None, :, b].expand(rows, -1), sums_x[:, None, b].expand(-1, n_dim), total)
        acc = acc + total
    return acc


def weights(qtype, n_dim, k_dim, seed):
    """gguf's quantization of random weights, and random blocks (every integer, Q8_0's -128 included), interleaved
    for the int8 kernel."""
    from tests.selfspec.kernel.test_quantized import quantized_weight

    found = [quantized_weight(qtype, n_dim, k_dim, seed=seed)[0], q.random_weight(qtype, n_dim, k_dim, seed=seed)]
    for weight in found:
        weight.set_interleaved(True)
    return found


def rows_of(rows, k_dim, seed):
    x = torch.randn(rows, k_dim, generator=torch.Generator().manual_seed(seed))
    x[0, :q.BLOCK_WEIGHTS] = 0  # a block of zeros (scale 0)
    if k_dim > q.BLOCK_WEIGHTS:
        x[-1, q.BLOCK_WEIGHTS:2 * q.BLOCK_WEIGHTS] *= 1e3  # an outlier block
    return x


@pytest.fixture(params=int8.INT8_PATHS)
def path(request, needs_kernel):
    if request.param not in int8.int8_paths():
        pytest.skip(f"this CPU lacks the int8 kernel's {request.param} path (it has {int8.int8_paths()})")
    return request.param


def test_the_cpu_has_the_expected_paths(needs_kernel):
    cpu = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    assert int8.int8_paths()[0] == "scalar"
    assert ("avx2" in int8.int8_paths()) == (" avx2" in cpu)
    assert ("vnni" in int8.int8_paths()) == (" avx512_vnni" in cpu and " avx512vl" in cpu and " avx512bw" in cpu)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n_dim", [1, 8, 13, 24, 67])
def test_interleaving_permutes_the_bytes_and_every_row_reads_back(needs_kernel, qtype, n_dim):
    weight = q.random_weight(qtype, n_dim, 96, seed=n_dim)
    plain, rows = weight.blocks.clone(), weight.dequantize()
    weight.set_interleaved(True)
    assert weight.interleaved and "interleaved" in repr(weight)
    assert torch.equal(weight.blocks.flatten().sort()[0], plain.flatten().sort()[0])  # the same bytes,
    assert torch.equal(weight.blocks, plain) == (n_dim < int8.GROUP_ROWS)  # moved where a group exists
    assert torch.equal(weight.dequantize(), rows)  # read back through the layout
    ids = torch.tensor([n_dim - 1, 0, n_dim // 2, n_dim - 1])
    assert torch.equal(weight[ids], rows[ids]) and torch.equal(weight.rows(first=n_dim // 2), rows[n_dim // 2:])
    weight.set_interleaved(False)
    assert torch.equal(weight.blocks, plain)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 9, 32, 33])
@pytest.mark.parametrize("n_dim, k_dim", SHAPES)
def test_each_path_is_the_naive_reference_bit_for_bit(path, qtype, rows, n_dim, k_dim):
    x = rows_of(rows, k_dim, seed=rows)
    for weight in weights(qtype, n_dim, k_dim, seed=rows + n_dim):
        y = int8.int8_linear(x, weight, path)
        assert y.shape == (rows, n_dim) and torch.equal(y, int8_reference(x, weight))


@pytest.mark.parametrize("qtype", TYPES)
def test_the_result_is_the_float_product_up_to_rounding_x_to_int8(needs_kernel, qtype):
    """|y - x W^T| <= sum_k |W[n, k]| * (x's block scale / 2): x rounded, nothing else lost (but float32 sums); and
    not the float path's result (the reference above would pass a kernel that did not round x: this would not)."""
    weight = weights(qtype, 37, 608, seed=3)[0]
    x = rows_of(5, 608, seed=3)
    y, exact = int8.int8_linear(x, weight).double(), x.double() @ weight.dequantize().double().T
    step = (x.view(5, -1, 32).abs().amax(-1) / 127).repeat_interleave(32, dim=1).double()  # [rows, k]
    bound = step / 2 @ weight.dequantize().double().abs().T
    assert ((y - exact).abs() <= 1.001 * bound + 1e-4).all()
    assert not torch.equal(y, q.QuantizedLinear(weight, backend="float")(x).double())
    assert (y - exact).abs().max() > 1e-4


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows", [2, 4, 5, 8, 31, 32, 70])
def test_each_row_is_the_row_computed_alone(path, qtype, rows):
    weight = weights(qtype, 66, 160, seed=rows)[1]
    x = rows_of(rows, 160, seed=rows)
    y = int8.int8_linear(x, weight, path)
    for i in range(rows):
        assert torch.equal(int8.int8_linear(x[i:i + 1], weight, path)[0], y[i]), f"row {i} of {rows}"


def test_threads_do_not_change_the_result(needs_kernel):
    weight, x = q.random_weight("Q4_1", 512, 512, seed=1), rows_of(6, 512, seed=1)
    weight.set_interleaved(True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = int8.int8_linear(x, weight)
        torch.set_num_threads(2)
        assert torch.equal(int8.int8_linear(x, weight), alone)
    finally:
        torch.set_num_threads(threads)


def test_a_missing_path_or_a_bad_backend_says_so(needs_kernel, monkeypatch):
    weight = q.random_weight("Q8_0", 4, 64)
    with pytest.raises(ValueError, match="set_interleaved"):  # the file's layout: not what the kernel reads
        int8.int8_linear(torch.ones(1, 64), weight)
    weight.set_interleaved(True)
    with pytest.raises(ValueError, match="expected one of"):
        int8.int8_linear(torch.ones(1, 64), weight, "avx512")
    if "vnni" not in int8.int8_paths():
        with pytest.raises(ValueError, match="lacks"):
            int8.int8_linear(torch.ones(1, 64), weight, "vnni")
    with pytest.raises(ValueError, match="expected one of"):
        q.QuantizedLinear(weight, backend="int4")
    monkeypatch.setenv(backends.BACKEND_ENV, "fast")
    with pytest.raises(ValueError, match=backends.BACKEND_ENV):
        q.QuantizedLinear(weight)


def test_the_layer_takes_its_backend_for_every_row_count(needs_kernel, monkeypatch):
    weight, bias = q.random_weight("Q4_0", 40, 96, seed=2), torch.randn(40)
    monkeypatch.setattr(backends, "chosen_backend", lambda qtype: "float")
    monkeypatch.delenv(backends.BACKEND_ENV, raising=False)
    assert q.QuantizedLinear(weight).backend == "float"  # the default: "auto", measured (here: float)
    monkeypatch.setattr(backends, "chosen_backend", lambda qtype: "int8")
    assert q.QuantizedLinear(weight).backend == "int8" and weight.interleaved
    monkeypatch.setenv(backends.BACKEND_ENV, "int8")
    layer = q.QuantizedLinear(weight, bias)
    assert layer.backend == "int8" and "backend=int8" in repr(layer)
    for rows in (1, 4, 32, 50):  # more than MAX_ROWS too: one function whatever the rows
        x = rows_of(rows, 96, seed=rows).view(rows, 1, 96)
        assert torch.equal(layer(x), (int8_reference(x[:, 0], weight) + bias)[:, None])
    x = torch.randn(3, 96, requires_grad=True)  # a gradient to record: the dequantized chunks, as before
    torch.testing.assert_close(layer(x), x @ weight.dequantize().T + bias)
    backends.use_backend(torch.nn.Sequential(layer), "float")
    assert layer.backend == "float" and not weight.interleaved  # (the file's layout back, for the float kernel)


def test_auto_measures_once_and_keeps_the_choice(needs_kernel, monkeypatch, tmp_path):
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    measured = []

    def measure(qtype):
        measured.append(qtype)
        return {"float": {1: 10.0, q.MAX_ROWS: 30.0}, "int8": {1: 5.0 if qtype == 3 else 9.5, q.MAX_ROWS: 20.0}}
    monkeypatch.setattr(backends, "measure_backends", measure)
    backends.chosen_backend.cache_clear()
    try:
        assert backends.resolve_backend("auto", "Q4_1") == "int8"  # 0.5x of the float path's time
        assert backends.resolve_backend("auto", "Q8_0") == "float"  # 0.95x: not clearly faster
        backends.chosen_backend.cache_clear()  # a new process: the file decides, nothing measured again
        assert backends.resolve_backend("auto", "Q4_1") == "int8" and backends.resolve_backend("auto", "Q8_0") == "float"
        assert measured == [3, 8] and list(tmp_path.glob("quantized/backends-*.json"))
        model = torch.nn.Sequential(q.QuantizedLinear(q.random_weight("Q4_1", 8, 32), backend="auto"),
                                    q.QuantizedLinear(q.random_weight("Q8_0", 8, 32), backend="auto"))
        line = backends.describe(model)  # what --verbose and the benchmark print
        assert line.startswith("quantized products (") and "Q4_1 int8 (ms float / int8: 1 row 10.0 / 5.0" in line
        assert f"{q.MAX_ROWS} rows 30.0 / 20.0" in line and "Q8_0 float" in line
        assert backends.describe(torch.nn.Linear(2, 2)) is None
    finally:
        backends.chosen_backend.cache_clear()


def test_measuring_times_both_backends(needs_kernel):
    times = backends.measure_backends(q.TYPES["Q4_1"], layers=2, shape=(64, 128), repeats=1)
    assert set(times) == {"float", "int8"} and all(set(t) == {1, 4, q.MAX_ROWS} for t in times.values())
    assert all(ms > 0 for t in times.values() for ms in t.values())


@pytest.fixture(params=TYPES)
def int8_model(request, tmp_path):
    """A tiny Llama written to a GGUF file of `qtype`, loaded with its blocks kept, every linear on the int8 backend."""
    from tests.selfspec.kernel.test_quantized import tiny_gguf_file

    kept = load_model(tiny_gguf_file(request.param, tmp_path))
    backends.use_backend(kept, "int8")
    linears = [m for m in kept.modules() if isinstance(m, q.QuantizedLinear)]
    assert linears and all(m.backend == "int8" for m in linears)
    return kept


# (a random tiny model rarely repeats itself: enough prompts that the ngram drafter's drafts are sometimes right)
PROMPTS = [repetitive_prompt(20, vocab_size=256, period=4)] + [random_prompt(7 + s, vocab_size=256, seed=s)
                                                               for s in range(1, 9)]


def test_speculation_over_int8_products_is_exact(needs_kernel, int8_model):
    plain = SelfSpecModel(int8_model, drafter="none")
    expected = [plain.generate(p, max_new_tokens=40, eos_token_id=[]).sequences[0] for p in PROMPTS]
    heads = trained_heads(int8_model, greedy_sequences(int8_model, PROMPTS, 40), num_heads=3)
    for drafter in [dict(drafter="ngram"), dict(heads=heads), dict(drafter="early_exit", exit_layer=1)]:
        engine, stats = SelfSpecModel(int8_model, **drafter), []
        for prompt, tokens in zip(PROMPTS, expected):
            out = engine.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
            assert torch.equal(out.sequences[0], tokens), drafter
            stats.append(out.stats)
        assert_exercised(stats, what=str(list(drafter)))


@pytest.mark.parametrize("qtype", TYPES)
def test_the_avx2_build_computes_the_same_on_each_path(needs_kernel, qtype):
    """The library built without AVX-512 (what an AVX2-only CPU runs; a CPU with AVX-512 builds it too for this):
    each of its paths this CPU has gives the reference's result, so no path leans on the build's own flags."""
    import ctypes

    from selfspec.kernel import few_row_linear as frl

    library = frl._built_library("avx2")[0]
    linear = library.quantized_linear_int8
    linear.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                       ctypes.c_long, ctypes.c_void_p]
    linear.restype = ctypes.c_int
    weight, x = weights(qtype, 37, 608, seed=5)[1], rows_of(9, 608, seed=5)
    for name in int8.int8_paths():
        y = torch.empty(9, 37)
        assert linear(weight.qtype, int8.INT8_PATHS.index(name), x.data_ptr(), 9, 608, weight.blocks.data_ptr(), 37,
                      y.data_ptr()) == 0
        assert torch.equal(y, int8_reference(x, weight)), name
