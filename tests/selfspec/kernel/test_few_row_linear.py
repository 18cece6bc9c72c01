"""The few-row kernel: F.linear's values over 2-32 float32 rows, each row independent of its neighbours; layers
routed only inside the engine's steps and only for the products the kernel is for; the engine's output with it
equal to the output without it; a clear error when it is demanded and cannot run; a quiet fallback when it does
not build."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torch.nn.utils.prune as prune

from selfspec import SelfSpecModel
from selfspec.kernel import few_row_linear as frl
from selfspec.kernel.few_row_linear import FewRowLinears, resolve_few_row_kernel
from selfspec.cache_dir import cache_dir
from tests.conftest import random_prompt, tiny_model
from tests.selfspec.exercised import assert_exercised, greedy_sequences, trained_heads


@pytest.fixture(params=["avx2", "avx512"])
def isa_kernel(request, needs_kernel):
    """The kernel built for each instruction set this CPU runs (the AVX2 build everywhere the kernel runs)."""
    kernel, why_not = frl._load(request.param)
    if kernel is None:
        pytest.skip(f"no {request.param} kernel here: {why_not}")
    return kernel


def test_the_kernel_is_built_for_the_widest_instructions_here(needs_kernel):
    assert frl._load()[0] is frl._load(frl.kernel_isa())[0]
    assert frl.kernel_isa() == {"AVX512": "avx512", "AVX2": "avx2"}[torch.backends.cpu.get_cpu_capability()]


# rows: the kernel takes rows 3 (AVX2) or 4 (AVX-512) at a time, 48 per sweep; k_dim: 8 or 16 columns at a time (a
# last 8 with AVX-512: 8, 136, 600), 256 per slice (600: 3 slices)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 16, 32, 50])
@pytest.mark.parametrize("n_dim, k_dim", [(1, 8), (7, 64), (64, 136), (300, 48), (9, 600)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_computes_f_linear(isa_kernel, rows, n_dim, k_dim, with_bias):
    g = torch.Generator().manual_seed(rows * 1000 + n_dim + k_dim)
    x = torch.randn(rows, k_dim, generator=g)
    weight = torch.randn(n_dim, k_dim, generator=g)
    bias = torch.randn(n_dim, generator=g) if with_bias else None
    out = frl._run(isa_kernel, x, weight, bias)
    assert out.shape == (rows, n_dim)
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5 * k_dim ** 0.5)
    for row in range(rows):  # the same sum in the same order whatever the rows beside it: bitwise
        assert torch.equal(frl._run(isa_kernel, x[row : row + 1], weight, bias)[0], out[row])


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 33])
@pytest.mark.parametrize("n_dim, k_dim", [(1, 8), (7, 64), (64, 136), (9, 600)])
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_bfloat16_weights_are_widened_exactly(needs_kernel, isa, rows, n_dim, k_dim):
    # the bfloat16 entry point computes F.linear with the weights as float32 holds them (a bfloat16 value widens to
    # float32 exactly), to float32 rounding, each row independent of its neighbours
    kernel, why_not = frl._load_bf16(isa)
    if kernel is None:
        pytest.skip(f"no {isa} kernel here: {why_not}")
    g = torch.Generator().manual_seed(rows * 1000 + n_dim + k_dim)
    x, bias = torch.randn(rows, k_dim, generator=g), torch.randn(n_dim, generator=g)
    weight = torch.randn(n_dim, k_dim, generator=g).to(torch.bfloat16)
    out = frl._run(kernel, x, weight, bias)
    torch.testing.assert_close(out, F.linear(x, weight.float(), bias), rtol=1e-5, atol=1e-5 * k_dim ** 0.5)
    for row in range(rows):
        assert torch.equal(frl._run(kernel, x[row : row + 1], weight, bias)[0], out[row])
    if isa == frl.kernel_isa():  # the public entry runs this build
        torch.testing.assert_close(frl.few_row_linear(x, weight, bias), out, rtol=0, atol=0)


@pytest.fixture
def kernel_on_threads(needs_kernel):
    """set(threads): torch's thread count, which the kernel splits its products between (restored after); skips
    where the kernel was built without OpenMP (one thread whatever torch's count)."""
    before = torch.get_num_threads()

    def set_threads(threads: int) -> None:
        torch.set_num_threads(threads)
        if threads > 1 and frl.kernel_threads() == 1:
            pytest.skip("the kernel was built without OpenMP here: it runs on one thread")
        assert frl.kernel_threads() == threads

    yield set_threads
    torch.set_num_threads(before)


# Shapes of at least two threads' worth of weights (the kernel's WEIGHTS_PER_THREAD, 32768, each): n_dim % 4 = 0, 1,
# 3 and 1 (a last share with the rows past the last block of four); 3 threads: shares of unequal length, where a
# product has three threads' worth (4101 x 24, 1003 x 112).
@pytest.mark.parametrize("rows", [1, 2, 4, 5, 50])
@pytest.mark.parametrize("n_dim, k_dim", [(256, 256), (1029, 64), (131, 520), (4101, 24), (1003, 112)])
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_threads_split_the_weight_rows_and_change_no_bit(kernel_on_threads, rows, n_dim, k_dim, threads,
                                                         weight_dtype, isa):
    kernel, why_not = (frl._load_bf16 if weight_dtype is torch.bfloat16 else frl._load)(isa)
    if kernel is None:
        pytest.skip(f"no {isa} kernel here: {why_not}")
    assert n_dim * k_dim >= 2 * frl.weights_per_thread()  # (so the product is split)
    g = torch.Generator().manual_seed(rows * 1000 + n_dim + k_dim)
    x, bias = torch.randn(rows, k_dim, generator=g), torch.randn(n_dim, generator=g)
    weight = torch.randn(n_dim, k_dim, generator=g).to(weight_dtype)
    kernel_on_threads(1)
    alone = frl._run(kernel, x, weight, bias)
    kernel_on_threads(threads)
    assert frl._built_library(isa)[0].few_row_linear_threads() == threads  # (this build splits too)
    split = frl._run(kernel, x, weight, bias)
    assert torch.equal(split, alone)  # each output is one thread's sum, the same sum in the same order
    torch.testing.assert_close(split, F.linear(x, weight.float(), bias), rtol=1e-5, atol=1e-5 * k_dim ** 0.5)


def test_the_kernel_shares_the_process_openmp_runtime(kernel_on_threads):
    # Built with OpenMP, the kernel must run in the runtime torch loaded, not a second one whose threads would spin
    # against torch's on the same cores.
    kernel_on_threads(2)
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps here to list the loaded libraries")
    runtimes = {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line or "libomp" in line}
    assert len(runtimes) == 1, runtimes


@pytest.mark.usefixtures("needs_kernel")
def test_kernel_takes_batched_and_strided_inputs():
    x = torch.randn(2, 3, 40)[:, :, :32]  # [2, 3, 32], not contiguous
    weight = torch.randn(24, 32)
    torch.testing.assert_close(frl.few_row_linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("needs_kernel")
def test_kernel_refuses_a_bias_of_another_length():
    # the kernel reads one bias value per output: a short bias would be read past its end
    x, weight = torch.randn(3, 32), torch.randn(24, 32)
    with pytest.raises(ValueError, match="one value per output"):
        frl.few_row_linear(x, weight, torch.randn(23))


class CountingKernel:
    def __init__(self, kernel):
        self.kernel, self.rows, self.outputs, self.inputs = kernel, [], [], []

    def __call__(self, x_ptr, rows, *args):  # args: k, weight, n (the outputs per row), bias, out
        self.rows.append(rows)
        self.inputs.append(args[0])
        self.outputs.append(args[2])
        return self.kernel(x_ptr, rows, *args)


@pytest.fixture
def counting_kernel(monkeypatch):
    """The float32 kernel, counting its calls; `.bf16`: the bfloat16-weight entry point, counting its own."""
    kernel, why_not = frl._load()
    if kernel is None:
        pytest.skip(f"kernel unavailable: {why_not}")
    counting, counting.bf16 = CountingKernel(kernel), CountingKernel(frl._load_bf16()[0])
    monkeypatch.setattr(frl, "_load", lambda: (counting, None))
    monkeypatch.setattr(frl, "_load_bf16", lambda: (counting.bf16, None))
    return counting


def test_draft_layers_stream_bfloat16_weights_and_the_models_layers_never_do(counting_kernel):
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 16, bias=False))
    head = torch.nn.Sequential(torch.nn.Linear(16, 32), model[2])  # its second layer is the model's own
    routed = FewRowLinears(model, draft_modules=[head], draft_dtype=torch.bfloat16)
    x = torch.randn(3, 16)
    with torch.no_grad():
        expected_head = F.linear(x, head[0].weight.to(torch.bfloat16).float(), head[0].bias)
        with routed:
            model(x)
            got = head[0](x), head[0](x[:1])  # a drafter's one-row products too
            head[0](torch.randn(frl.MAX_ROWS + 1, 16))  # beyond MAX_ROWS: F.linear with the float32 weight
    assert counting_kernel.rows == [3, 3] and counting_kernel.outputs == [24, 16]  # the model's layers: float32
    assert counting_kernel.bf16.rows == [3, 1] and counting_kernel.bf16.outputs == [32, 32]
    torch.testing.assert_close(got[0], expected_head, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1][0], got[0][0])
    assert not torch.allclose(got[0], F.linear(x, head[0].weight, head[0].bias), rtol=0, atol=1e-6)  # rounded weights
    assert head[0].weight.dtype is torch.float32  # the layer itself is untouched
    # the copy follows the weight: changed in place (a user training the head between calls), the next call sees it
    with torch.no_grad():
        head[0].weight.mul_(-1)
        with routed:
            flipped = head[0](x)
    torch.testing.assert_close(flipped, F.linear(x, head[0].weight.to(torch.bfloat16).float(), head[0].bias))
    # without a draft dtype a drafter's layers run as the model's: float32, from two rows
    counting_kernel.rows.clear(), counting_kernel.bf16.rows.clear()
    with FewRowLinears(model, draft_modules=[head]), torch.no_grad():
        head[0](x), head[0](x[:1])
    assert counting_kernel.rows == [3] and counting_kernel.bf16.rows == []


def test_int8_draft_layers_multiply_q8_0_blocks_and_others_stream_bfloat16(needs_kernel):
    """draft_dtype=torch.int8: a drafter's layer whose input size is a multiple of 32 multiplies the weight rounded to
    Q8_0 blocks through the int8 kernel (bit for bit the int8 kernel over those blocks); a layer of another input
    size streams bfloat16; the model's layers stay float32."""
    from selfspec.kernel import int8
    from selfspec.kernel.quantized import TYPES, QuantizedWeight

    model = torch.nn.Sequential(torch.nn.Linear(64, 24))
    head = torch.nn.Sequential(torch.nn.Linear(64, 40), torch.nn.Linear(40, 64, bias=False))
    routed = FewRowLinears(model, draft_modules=[head], draft_dtype=torch.int8)
    assert routed.draft_copy_bytes == 40 * 64 * 34 // 32 + 64 * 40 * 2
    x = torch.randn(3, 64)
    blocks = QuantizedWeight(int8.q8_0_blocks(head[0].weight.detach()), TYPES["Q8_0"], 64)
    blocks.set_interleaved(True)
    with torch.no_grad():
        expected = int8.int8_linear(x, blocks) + head[0].bias
        second = F.linear(expected, head[1].weight.to(torch.bfloat16).float())
        with routed:
            got = head[0](x)
            got_second = head[1](got)
            one = head[0](x[:1])
            model_out = model(x)
    assert torch.equal(got, expected) and torch.equal(one[0], got[0])
    torch.testing.assert_close(got_second, second, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, F.linear(x, head[0].weight, head[0].bias), rtol=0, atol=1e-5)  # rounded
    torch.testing.assert_close(model_out, model(x), rtol=1e-5, atol=1e-6)


def test_layers_are_routed_only_inside_and_only_for_few_float32_rows(counting_kernel):
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8, bias=False))
    routed = FewRowLinears(model, None)
    assert len(routed.forwards) == 2
    x = torch.randn(3, 16)
    expected = model(x)
    assert counting_kernel.rows == []  # outside: plain nn.Linear
    with routed, torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-6)
        assert counting_kernel.rows == [3, 3]
        model(torch.randn(1, 16))  # one row: plain decoding stays on F.linear
        model(torch.randn(frl.MAX_ROWS + 1, 16))  # beyond MAX_ROWS
        model.double()(torch.randn(4, 16, dtype=torch.float64))  # not float32
        model.float()
        with torch.enable_grad():
            model(torch.randn(4, 16))  # the weights need gradients: F.linear's autograd
    assert counting_kernel.rows == [3, 3]
    assert all("forward" not in layer.__dict__ for layer in model.modules())
    model(x)
    assert counting_kernel.rows == [3, 3]
    bias_only = torch.nn.Linear(16, 8)
    bias_only.weight.requires_grad_(False)  # only the bias trains: still F.linear's autograd
    with FewRowLinears(bias_only), torch.enable_grad():
        bias_only(torch.randn(3, 16)).sum().backward()
    assert bias_only.bias.grad is not None and counting_kernel.rows == [3, 3]


def test_one_row_products_go_through_the_kernel_only_when_routed(counting_kernel):
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8, bias=False))
    head = torch.nn.Sequential(torch.nn.Linear(16, 8))
    routed = FewRowLinears(model, draft_modules=[head], draft_dtype=torch.bfloat16)
    x = torch.randn(1, 16)
    expected = model(x)
    with routed, torch.no_grad():
        model(x), head(x)
    assert counting_kernel.rows == [] and counting_kernel.bf16.rows == [1] and not routed.one_row
    routed.route_one_row(True)
    with routed, torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-6)
        head(x)
    assert counting_kernel.rows == [1, 1] and counting_kernel.bf16.rows == [1, 1] and routed.one_row
    assert all("forward" not in layer.__dict__ for layer in model.modules())  # still only inside
    routed.route_one_row(False)
    with routed, torch.no_grad():
        model(x), model(torch.randn(3, 16)), head(x)
    assert counting_kernel.rows == [1, 1, 3, 3] and counting_kernel.bf16.rows == [1, 1, 1] and not routed.one_row


class ScriptedPasses:
    """A clock for `one_row_pays`: each pass reads it at its start and end, the kernel's pass first, then F.linear's;
    a kernel pass lasts kernel[i] seconds, F.linear's blas[i] (i: the pass, 0 the warm-up)."""

    def __init__(self, kernel: list[float], blas: list[float]):
        self.durations = [d for pair in zip(kernel, blas) for d in pair]
        self.reads, self.now = 0, 0.0

    def __call__(self) -> float:
        if self.reads % 2:  # the end of a pass
            self.now += self.durations[self.reads // 2]
        self.reads += 1
        return self.now


def test_one_row_pays_where_the_kernel_is_clearly_faster(needs_kernel):
    layers = [torch.nn.Linear(16, 24), torch.nn.Linear(24, 8, bias=False)]
    kernel = frl._load()[0]

    def pays(kernel_seconds, blas_seconds):
        clock = ScriptedPasses(kernel_seconds, blas_seconds)
        answer = frl.one_row_pays(layers, kernel, repeats=3, timer=clock)
        assert clock.reads == 2 * 2 * 4  # (3 passes + a warm-up) of each, read at start and end
        return answer

    assert pays([9.0, 0.8, 0.85, 0.5], [1.0] * 4)  # median 0.8 of 1.0; the slow warm-up pass is not counted
    assert not pays([0.1, 0.95, 0.92, 0.5], [1.0] * 4)  # median 0.92: within noise of equal, F.linear stays
    assert not pays([0.8] * 4, [0.85] * 4)
    assert pays([1.0, 1.0, 1.0, 1.0], [1.0, 1.2, 1.15, 2.0])  # F.linear's median 1.2
    assert not frl.one_row_pays(layers, None) and not frl.one_row_pays([], kernel)
    once = ScriptedPasses([9.0, 0.5], [1.0, 1.0])  # one timed pass after the warm-up: the warm-up is not counted
    assert frl.one_row_pays(layers, kernel, repeats=1, timer=once) and once.reads == 8
    assert frl.one_row_pays(layers, kernel) in (True, False)  # the real clock: measures without failing


def test_a_layer_whose_weight_is_not_a_parameter_or_not_contiguous_runs_as_nn_linear(counting_kernel):
    # pruning replaces `weight` by a plain attribute (weight_orig * mask, set by a pre-hook): the routed forward must
    # use that weight, not the unpruned parameter; a transposed weight is not what the kernel reads
    pruned, transposed = torch.nn.Linear(16, 8), torch.nn.Linear(8, 8)
    prune.random_unstructured(pruned, "weight", amount=0.5)
    transposed.weight.data = transposed.weight.data.t()
    routed = FewRowLinears(pruned, transposed)
    x, y = torch.randn(3, 16), torch.randn(3, 8)
    with torch.no_grad():
        expected = F.linear(x, pruned.weight, pruned.bias), F.linear(y, transposed.weight, transposed.bias)
        with routed:
            got = pruned(x), transposed(y)
    assert not torch.equal(pruned.weight, pruned.weight_orig)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert counting_kernel.rows == []  # both through F.linear

def test_routing_covers_each_step_and_not_the_code_between(counting_kernel):
    layer = torch.nn.Linear(8, 8)
    routed = FewRowLinears(layer)

    @torch.no_grad()
    def steps():
        for _ in range(3):
            yield layer(torch.randn(2, 8)).shape[0]

    seen = []
    for item in routed.routing(steps()):
        seen.append(item)
        assert "forward" not in layer.__dict__  # the caller's code between steps sees a plain layer
        with torch.no_grad():
            layer(torch.randn(2, 8))
    assert seen == [2, 2, 2] and counting_kernel.rows == [2, 2, 2]


@pytest.mark.parametrize("one_row", [False, True])
@pytest.mark.parametrize("drafter", ["medusa", "ngram"])
def test_engine_output_is_unchanged_by_the_kernel_which_it_uses(counting_kernel, drafter, one_row):
    # float32 here (the kernel's dtype); the output is compared with the same engine without the kernel, and with
    # the model's own greedy generate; plain decoding's one-row products through it or not (`route_one_row`)
    model = tiny_model("llama", dtype=torch.float32)
    prompts = [random_prompt(9, seed=1), random_prompt(14, seed=2)]
    options = {}
    if drafter == "medusa":
        options = dict(heads=trained_heads(model, greedy_sequences(model, prompts, 40)), min_draft_confidence=0.0)
    with_kernel = SelfSpecModel(model, drafter=drafter, **options)
    with_kernel.few_row_linears.route_one_row(one_row)
    counting_kernel.rows.clear()  # (measuring which route pays, at wrap time, ran one-row products through it)
    without = SelfSpecModel(model, drafter=drafter, few_row_kernel="off", **options)
    assert with_kernel.few_row_kernel and not without.few_row_kernel
    expected = greedy_sequences(model, prompts, 30)
    stats = []
    for prompt, reference in zip(prompts, expected):
        out = with_kernel.generate(prompt, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
        plain = without.generate(prompt, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences[0], plain.sequences[0])
        assert torch.equal(out.sequences[0], reference)
        stats.append(out.stats)
    assert_exercised(stats, rejected=drafter == "medusa")
    assert any(rows > 1 for rows in counting_kernel.rows)  # verify forwards ran through it
    if drafter == "ngram":  # (no drafter layers: every product the kernel ran was the model's)
        assert (1 in counting_kernel.rows) == one_row  # and plain decoding's steps, when routed
    batch = with_kernel.generate(prompts, max_new_tokens=30, num_draft_tokens=2, eos_token_id=[])
    assert all(torch.equal(row, reference) for row, reference in zip(batch.sequences, expected))


def test_engine_output_on_two_threads_is_its_greedy_output(kernel_on_threads, counting_kernel):
    # hidden 256: the attention's and MLP's products (256 x 256, 512 x 256) are split between the threads
    model = tiny_model("llama", dtype=torch.float32, hidden=256)
    prompts = [random_prompt(9, seed=1), random_prompt(14, seed=2)]
    expected = greedy_sequences(model, prompts, 50)
    heads = trained_heads(model, [sequence[: len(prompt[0]) + 25] for sequence, prompt in zip(expected, prompts)])
    kernel_on_threads(2)
    spec = SelfSpecModel(model, heads=heads, min_draft_confidence=0.0)
    spec.few_row_linears.route_one_row(True)
    for calls in (counting_kernel.rows, counting_kernel.inputs, counting_kernel.outputs):
        calls.clear()
    stats = []
    for prompt, reference in zip(prompts, expected):
        out = spec.generate(prompt, max_new_tokens=50, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences[0], reference)
        stats.append(out.stats)
    assert_exercised(stats)  # (the heads learned the first 25 tokens: later drafts are rejected)
    split = [(rows, n * k) for rows, n, k in zip(counting_kernel.rows, counting_kernel.outputs, counting_kernel.inputs)
             if n * k >= 2 * frl.weights_per_thread()]
    assert any(rows == 1 for rows, _ in split) and any(rows > 1 for rows, _ in split)  # decodes and verifications


def test_a_tree_projects_its_draft_vocabulary_through_the_kernel(counting_kernel):
    # A tree's levels project several rows onto the draft vocabulary's LM head rows at once: the engine routes that
    # product (the LM head's rows as a layer of their own) as it routes the heads', and the output is unchanged.
    from tests.selfspec.drafters.test_eagle import randomized_head

    model = tiny_model("llama", dtype=torch.float32)
    draft_vocab = torch.arange(3, 43)  # 40 of the 96 ids
    head = randomized_head(model, draft_vocab)
    prompts = [random_prompt(9, seed=1), random_prompt(14, seed=2)]
    with_kernel = SelfSpecModel(model, heads=head, tree_size=6)
    without = SelfSpecModel(model, heads=head, tree_size=6, few_row_kernel="off")
    for prompt in prompts:
        out = with_kernel.generate(prompt, max_new_tokens=20, num_draft_tokens=3, eos_token_id=[])
        plain = without.generate(prompt, max_new_tokens=20, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences[0], plain.sequences[0])
    # the drafter's layers stream bfloat16 weights by default (`draft_dtype="auto"`), so its projections are there
    assert with_kernel.draft_dtype is torch.bfloat16
    kernel = counting_kernel.bf16
    projections = [rows for rows, n in zip(kernel.rows, kernel.outputs) if n == draft_vocab.numel()]
    assert projections and max(projections) > 1  # a tree level's rows, onto the draft vocabulary, in the kernel
    assert not any(n == draft_vocab.numel() for n in counting_kernel.outputs)  # not in float32


@pytest.mark.parametrize("tree_size", [None, 6])
def test_bfloat16_drafts_are_verified_exactly(counting_kernel, tree_size):
    # The drafter's weights in bfloat16 change its drafts, never the output: greedy equals the model's generate (a
    # float32 model, so only the verify forwards' summation order differs from it, as with the kernel alone), with
    # drafts proposed, accepted and rejected, and the drafter's products through the bfloat16 entry point.
    from tests.selfspec.drafters.test_eagle import randomized_head

    model = tiny_model("llama", dtype=torch.float32)
    prompts = [random_prompt(9, seed=1), random_prompt(14, seed=2)]
    head = randomized_head(model, torch.arange(3, 43))
    half = SelfSpecModel(model, heads=head, tree_size=tree_size)
    full = SelfSpecModel(model, heads=head, tree_size=tree_size, draft_dtype=None)
    assert half.draft_dtype is torch.bfloat16 and full.draft_dtype is None
    expected = greedy_sequences(model, prompts, 24)
    stats = []
    for prompt, reference in zip(prompts, expected):
        out = half.generate(prompt, max_new_tokens=24, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences[0], reference)
        stats.append(out.stats)
    assert_exercised(stats, rejected=True)
    assert counting_kernel.bf16.rows  # the drafter ran on bfloat16 weights
    calls = len(counting_kernel.bf16.rows)
    for prompt, reference in zip(prompts, expected):
        assert torch.equal(full.generate(prompt, max_new_tokens=24, num_draft_tokens=3, eos_token_id=[]).sequences[0],
                           reference)
    assert len(counting_kernel.bf16.rows) == calls  # draft_dtype=None: not at all


def test_draft_dtype_settings_and_errors():
    assert frl.resolve_draft_dtype("auto", True) is torch.bfloat16
    assert frl.resolve_draft_dtype("auto", True, int8_model=True) is torch.int8  # (the model's products are int8)
    assert frl.resolve_draft_dtype("int8", True) is torch.int8
    assert frl.resolve_draft_dtype(torch.int8, True) is torch.int8
    assert frl.resolve_draft_dtype("auto", False, int8_model=True) is None
    with pytest.raises(ValueError, match="draft_dtype='int8' streams"):
        frl.resolve_draft_dtype("int8", False)
    assert frl.resolve_draft_dtype("auto", False) is None  # no kernel: the model's own dtype
    assert frl.resolve_draft_dtype(torch.bfloat16, True) is torch.bfloat16
    assert frl.resolve_draft_dtype(None, True) is None and frl.resolve_draft_dtype("model", True) is None
    with pytest.raises(ValueError, match="does not run for this model"):
        frl.resolve_draft_dtype("bfloat16", False)
    with pytest.raises(ValueError, match="draft_dtype='float16'"):
        frl.resolve_draft_dtype("float16", True)
    with pytest.raises(ValueError, match="does not run for this model"):  # a float64 model: the kernel is off
        SelfSpecModel(tiny_model(dtype=torch.float64), drafter="ngram", draft_dtype="bfloat16")


def test_settings_and_errors(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_few_row_kernel("off", cpu, torch.float32) is False
    assert resolve_few_row_kernel(False, cpu, torch.float32) is False
    assert resolve_few_row_kernel("auto", cpu, torch.float64) is False  # not float32: F.linear
    with pytest.raises(ValueError, match="float32 on a CPU"):
        resolve_few_row_kernel("on", cpu, torch.float64)
    with pytest.raises(ValueError, match="few_row_kernel='fast'"):
        resolve_few_row_kernel("fast", cpu, torch.float32)
    monkeypatch.setattr(frl, "_load", lambda: (None, "no C compiler found (install gcc, or set CC)"))
    assert resolve_few_row_kernel("auto", cpu, torch.float32) is False
    with pytest.raises(ValueError, match="no C compiler found"):
        SelfSpecModel(tiny_model(dtype=torch.float32), drafter="ngram", few_row_kernel=True)
    assert SelfSpecModel(tiny_model(dtype=torch.float32), drafter="ngram").few_row_linears is None


def _forget_builds():
    frl._load.cache_clear()
    frl._built_library.cache_clear()


def test_a_failed_build_falls_back_with_its_reason(monkeypatch):
    if frl.platform.machine().lower() not in ("x86_64", "amd64") or torch.backends.cpu.get_cpu_capability() not in (
            "AVX2", "AVX512"):
        pytest.skip("not an x86 CPU with AVX2: the build is never tried")
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    _forget_builds()
    try:
        kernel, why_not = frl._load()
        assert kernel is None and "did not build with false" in why_not
        assert frl.kernel_threads() == 1
    finally:
        _forget_builds()


def test_a_failed_build_is_not_retried_by_the_next_process_until_its_marker_goes(monkeypatch, tmp_path):
    """A machine without OpenMP (or a compiler that fails) pays the failed compile once, not in every process: the
    failure is kept beside the libraries, with its error, and the reason says how to try again."""
    if frl.platform.machine().lower() not in ("x86_64", "amd64") or torch.backends.cpu.get_cpu_capability() not in (
            "AVX2", "AVX512"):
        pytest.skip("not an x86 CPU with AVX2: the build is never tried")
    calls = tmp_path / "calls"
    compiler = tmp_path / "failing-cc"
    compiler.write_text(f"#!/bin/sh\necho run >> {calls}\necho 'no such option' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    markers_before = set(cache_dir().glob("kernels/*.failed"))
    try:
        _forget_builds()
        assert frl._load()[0] is None
        assert calls.read_text().count("run") == 2  # with OpenMP, then without
        _forget_builds()  # as a new process would
        kernel, why_not = frl._load()
        assert kernel is None and calls.read_text().count("run") == 2  # not compiled again
        assert "no such option" in why_not and "to try again" in why_not
        markers = set(cache_dir().glob("kernels/*.failed")) - markers_before
        assert len(markers) == 2
        for marker in markers:
            marker.unlink()
        _forget_builds()
        assert frl._load()[0] is None and calls.read_text().count("run") == 4  # tried again
    finally:
        _forget_builds()


# A new process that loads the cached kernel and computes with it: F.linear's values, or an error if it did not load.
USES_THE_KERNEL = """
import torch
import torch.nn.functional as F
from selfspec.kernel import few_row_linear as frl

x, weight = torch.randn(3, 64), torch.randn(16, 64)
torch.testing.assert_close(frl.few_row_linear(x, weight), F.linear(x, weight))
print("kernel used")
"""


def _build_here() -> Path:
    """The kernel's library as a process starting now builds or finds it in this test's cache directory."""
    _forget_builds()
    try:
        assert frl._load()[0] is not None
    finally:
        _forget_builds()
    [library] = cache_dir().glob("kernels/few_row_linear-*.so")
    return library


def _checksum(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def test_a_truncated_cached_kernel_is_rebuilt_not_loaded(needs_kernel):
    """A cut .so (a full disk, an interrupted copy) killed every later process at load (SIGBUS, exit 135): its
    checksum no longer matches, so it is rebuilt, here by two processes at once (each in a scratch folder of its own)."""
    library = _build_here()
    cut = library.read_bytes()[:1000]
    library.unlink()  # a new file, as a copy leaves it (cut in place, the mapping this process loaded would die too)
    library.write_bytes(cut)
    children = [subprocess.Popen([sys.executable, "-c", USES_THE_KERNEL], cwd=Path(__file__).resolve().parents[3],
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [child.communicate(timeout=600) for child in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0 and "kernel used" in out, (child.returncode, err[-3000:])
    assert any("rebuilding it" in err for _, err in outputs)
    assert library.stat().st_size > 1000 and frl._intact(library, _checksum(library))
    assert sorted(library.parent.iterdir()) == [library, _checksum(library)]  # no scratch folder left behind


def test_a_cached_kernel_without_its_checksum_is_rebuilt_and_an_intact_one_kept(needs_kernel, caplog):
    library = _build_here()
    _checksum(library).unlink()  # as an interrupted build, or an older selfspec, leaves it
    before = library.stat().st_ino
    with caplog.at_level(logging.WARNING, logger=frl.__name__):
        assert _build_here() == library
    assert "rebuilding it" in caplog.text and library.stat().st_ino != before  # a new file replaced it
    assert frl._intact(library, _checksum(library))
    caplog.clear()
    rebuilt = library.stat().st_ino
    with caplog.at_level(logging.WARNING, logger=frl.__name__):
        _build_here()
    assert library.stat().st_ino == rebuilt and "rebuilding" not in caplog.text  # its checksum vouches for it


def test_a_layer_whose_forward_was_replaced_is_left_alone(counting_kernel):
    layer = torch.nn.Linear(8, 8)
    hooked = lambda x: x * 2  # noqa: E731  (as accelerate's offloading hooks replace a layer's forward)
    layer.forward = hooked
    with FewRowLinears(layer), torch.no_grad():
        assert torch.equal(layer(torch.ones(3, 8)), torch.full((3, 8), 2.0))
    assert layer.__dict__["forward"] is hooked and counting_kernel.rows == []


def test_the_kernels_version_names_its_instruction_set(monkeypatch):
    """A curve learned with the AVX-512 build is not read with the AVX2 build (the same source, other costs)."""
    versions = {}
    for isa in ("avx2", "avx512"):
        monkeypatch.setattr(frl, "kernel_isa", lambda isa=isa: isa)
        frl.kernel_version.cache_clear()
        versions[isa] = frl.kernel_version()
    frl.kernel_version.cache_clear()
    assert versions["avx2"] != versions["avx512"]


def test_an_avx512_build_is_refused_where_the_cpu_lacks_it(monkeypatch, needs_kernel):
    monkeypatch.setattr(frl, "kernel_isa", lambda: "avx2")
    _forget_builds()
    try:
        kernel, why_not = frl._load("avx512")
        assert kernel is None and "lacks AVX-512" in why_not
        with pytest.raises(ValueError, match="isa='sse'"):
            frl._load("sse")
    finally:
        _forget_builds()
