"""Targets quantized by torchao or bitsandbytes: greedy output equals that quantized model's own `generate`, token for
token, for every drafter, chains and trees; the few-row kernel leaves quantized layers to their own forward.

torchao runs on this CPU in float32 (it refuses float64): int8 weight-only products are a float32 GEMM over the
dequantized int8 rows, so, like a plain float32 nn.Linear, they round differently over different numbers of rows
(at most a few float32 ulps: one-row and 2-8-row products part from wider ones); int8 dynamic activation products are
integer and row-independent, but their inputs come from float32 attention, which rounds differently over different
numbers of rows, and quantizing an activation can turn an ulp into a whole int8 step. The tiny models here have their
LM head sharpened (x8, before quantizing), so greedy choices mostly have margins far above that rounding and identity
is meaningful; where the model's own choice is a near-tie for its kind of rounding, either token is the model's, so
tokens are compared up to the first one. bitsandbytes 0.50 runs its 8-bit and 4-bit layers on a CPU too; where it is not
installed, or has no backend for this device, those tests skip.

bitsandbytes' 4-bit CPU path depends on the CPU (this is why those tests say which path they ran): on a CPU with
AVX512-BF16 a Linear4bit repacks its weight at its first forward and multiplies in bfloat16 (activations, block scales
and output), elsewhere it dequantizes to float32. The tolerances below follow the path taken (`bnb_4bit_products`):
bfloat16 products make near-ties far more common, so the greedy comparisons pick, from a pool of prompts, those whose
reference has no near-tie in its first steps.
"""
from __future__ import annotations

import logging
from functools import lru_cache

import pytest
import torch

from selfspec import SelfSpecModel
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.exercised import assert_exercised, greedy_sequences, trained_heads

NUM_NEW = 32
TREE_SIZE = 8
# Top-2 logit gaps, relative to the largest logit, under which a forward over other rows may round to the other greedy
# choice: float32 products (weight-only int8, bitsandbytes 4-bit) part by a few ulps; products over quantized
# activations (torchao int8 dynamic, bitsandbytes 8-bit) by up to an int8 step. Measured on these references: one step
# (int8 dynamic, the repetitive prompt, step 12) at 1.7e-4 flipped under an EAGLE tree; the smallest gaps of the other
# activation-quantizing models are above 3.4e-3, of the float32 ones above 8e-5.
FLOAT32_NEAR_TIE = 1e-5
INT8_ACTIVATIONS_NEAR_TIE = 1e-3
# bfloat16 products (bitsandbytes 4-bit on an AVX512-BF16 CPU): an output rounds to 2^-8 of itself, an activation too.
BFLOAT16_NEAR_TIE = 2e-2


def torchao():
    return pytest.importorskip("torchao", reason="torchao is not installed (pip install -e '.[quantized]')")


def bitsandbytes():
    """bitsandbytes, where it is installed and its 8-bit layers run on a CPU here (0.50 does)."""
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install -e '.[quantized]')")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # (each float32 product says it casts to float16)
    try:
        layer = bnb.nn.Linear8bitLt(16, 8, has_fp16_weights=False).to("cpu")
        layer(torch.ones(2, 16))
    except Exception as error:  # noqa: BLE001 (any failure means: no bitsandbytes backend for this device)
        pytest.skip(f"bitsandbytes {bnb.__version__} does not run on this CPU ({type(error).__name__}: {error}); "
                    "on a GPU: bash examples/gpu_check.sh")
    return bnb


def sharp_float32_model(seed: int = 0):
    """A tiny float32 Llama with confident next-token distributions (margins far above float32 rounding)."""
    model = tiny_model("llama", seed=seed, dtype=torch.float32, hidden=64)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def torchao_config(name: str):
    quantization = pytest.importorskip("torchao.quantization")
    return {"int8-weight-only": quantization.Int8WeightOnlyConfig,
            "int8-dynamic": quantization.Int8DynamicActivationInt8WeightConfig}[name]()


def torchao_model(config: str, lm_head: bool = False):
    """The sharp tiny Llama with its decoder linears (and with `lm_head`, its LM head) quantized by torchao; built
    once per module (tests only read it)."""
    torchao()
    return _torchao_model(config, lm_head)


@lru_cache(maxsize=None)
def _torchao_model(config: str, lm_head: bool):
    from torchao.quantization import quantize_

    model = sharp_float32_model()
    keep = None if lm_head else (lambda module, name: isinstance(module, torch.nn.Linear) and name != "lm_head")
    quantize_(model, torchao_config(config), filter_fn=keep)
    return model.eval()


PROMPTS = (random_prompt(8, seed=1), repetitive_prompt(20, seed=2), random_prompt(10, seed=3))
# where the model's own choices come by near-ties too early in a prompt of PROMPTS, the comparison takes the next of these
SPARE_PROMPTS = tuple(random_prompt(6 + i, seed=10 + i) for i in range(6)) + (repetitive_prompt(16, seed=20),)
MIN_STEPS = 8  # tokens a prompt's comparison needs before the model's first near-tie


def drafter_options(model, drafter: str) -> dict:
    """SelfSpecModel arguments for one drafter kind; heads briefly trained on the model's own greedy continuations
    (right often, wrong often: accepted and rejected drafts), once per model (chains and trees share them)."""
    if drafter in ("medusa", "eagle"):
        return {"heads": _heads(model, drafter), "min_draft_confidence": 0.0}
    if drafter == "early_exit":
        return {"drafter": "early_exit", "exit_layer": 1}
    return {"drafter": drafter}


@lru_cache(maxsize=None)
def reference(model, prompts: tuple = PROMPTS) -> list[torch.Tensor]:
    """The quantized model's own greedy continuations of `prompts` (`model.generate(do_sample=False)`)."""
    return greedy_sequences(model, prompts, NUM_NEW)


@lru_cache(maxsize=None)
def compared_prompts(model, near_tie: float) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(prompt, the model's greedy reference, steps to compare) for three prompts whose references have at least
    MIN_STEPS tokens before a near-tie: PROMPTS where they do (always, for float32 and int8 products here), else the
    next of SPARE_PROMPTS."""
    pool = PROMPTS + SPARE_PROMPTS
    chosen = [(prompt, sequence, steps) for prompt, sequence, steps
              in zip(pool, reference(model, pool), steps_before_near_tie(model, near_tie, pool)) if steps >= MIN_STEPS]
    assert len(chosen) >= 3, (f"only {len(chosen)} of {len(pool)} prompts have {MIN_STEPS} greedy tokens before a "
                              f"near-tie (relative top-2 gap under {near_tie}): too few to compare")
    return chosen[:3]


@lru_cache(maxsize=None)
def steps_before_near_tie(model, near_tie: float, prompts: tuple = PROMPTS) -> list[int]:
    """For each reference, its new tokens before the first that the model chose by a relative top-2 gap under
    `near_tie`; NUM_NEW where none was. Beyond it, another forward's rounding may rightly choose the runner-up."""
    counts = []
    for prompt, sequence in zip(prompts, reference(model, prompts)):
        with torch.no_grad():
            logits = model(sequence[None, :-1]).logits[0, prompt.shape[-1] - 1 :].float()  # [NUM_NEW, vocab]
        top2 = logits.topk(2, dim=-1).values
        near = (top2[:, 0] - top2[:, 1] < near_tie * logits.abs().amax(dim=-1)).nonzero()
        counts.append(int(near[0, 0]) if near.numel() else NUM_NEW)
    return counts


@lru_cache(maxsize=None)
def _heads(model, kind: str):
    if kind == "medusa":
        return trained_heads(model, greedy_sequences(model, PROMPTS, 40))
    from tests.selfspec.drafters.test_eagle import trained_head

    return trained_head(model)


def assert_greedy_equals_generate(model, spec, what: str, num_draft_tokens=3, near_tie: float = FLOAT32_NEAR_TIE):
    stats = []
    for prompt, expected, steps in compared_prompts(model, near_tie):
        out = spec.generate(prompt, max_new_tokens=NUM_NEW, num_draft_tokens=num_draft_tokens, eos_token_id=[])
        end = prompt.shape[-1] + steps
        assert torch.equal(out.sequences[0][:end], expected[:end]), \
            f"{what}: greedy tokens part from the model's own generate"
        stats.append(out.stats)
    assert_exercised(stats, what=what)


CASES = [("ngram", None), ("early_exit", None), ("medusa", None), ("medusa", TREE_SIZE), ("eagle", None),
         ("eagle", TREE_SIZE)]
IDS = [f"{drafter}-{'chain' if tree is None else f'tree{tree}'}" for drafter, tree in CASES]


@pytest.mark.parametrize("config", ["int8-weight-only", "int8-dynamic"])
@pytest.mark.parametrize(("drafter", "tree_size"), CASES, ids=IDS)
def test_torchao_greedy_equals_the_quantized_models_generate(config, drafter, tree_size):
    model = torchao_model(config)
    assert type(model.model.layers[0].mlp.down_proj.weight).__name__ == "Int8Tensor"  # (quantized, still nn.Linear)
    spec = SelfSpecModel(model, tree_size=tree_size, **drafter_options(model, drafter))
    assert spec.tree_size == (tree_size or 0)
    near_tie = INT8_ACTIVATIONS_NEAR_TIE if config == "int8-dynamic" else FLOAT32_NEAR_TIE
    assert_greedy_equals_generate(model, spec, f"torchao {config}, {drafter}, tree {tree_size}", near_tie=near_tie)


@pytest.mark.parametrize("drafter", ["ngram", "early_exit", "none"])
def test_torchao_with_a_quantized_lm_head(drafter):
    model = torchao_model("int8-weight-only", lm_head=True)
    assert type(model.lm_head.weight).__name__ == "Int8Tensor"
    spec = SelfSpecModel(model, **drafter_options(model, drafter))
    if drafter == "none":
        for prompt, expected in zip(PROMPTS, reference(model)):
            assert torch.equal(spec.generate(prompt, max_new_tokens=NUM_NEW, eos_token_id=[]).sequences[0], expected)
        return
    assert_greedy_equals_generate(model, spec, f"torchao LM head, {drafter}")


def assert_fresh_heads_run(model, kind: str, draft_vocab: torch.Tensor | None = None, near_tie: float = FLOAT32_NEAR_TIE):
    """Fresh heads of `kind` built for `model`, on float32 weights, decode the model's own greedy tokens."""
    from heads import EagleHead, MedusaHeads

    if kind == "medusa":
        heads = MedusaHeads.for_model(model, num_heads=3, share_lm_head=False)  # (own LM heads: copies of the base's)
    elif kind == "eagle":
        heads = EagleHead.for_model(model, draft_vocab=draft_vocab)
    else:  # "eagle3": its own LM head starts as the base's rows of the draft vocabulary
        heads = EagleHead.for_model(model, draft_vocab=draft_vocab, layout="eagle3", feature_layers="auto")
    assert {p.dtype for p in heads.parameters()} == {torch.float32}
    spec = SelfSpecModel(model, heads=heads, min_draft_confidence=0.0)
    for prompt, expected, _ in compared_prompts(model, near_tie):
        out = spec.generate(prompt, max_new_tokens=MIN_STEPS, eos_token_id=[])
        end = prompt.shape[-1] + MIN_STEPS
        assert torch.equal(out.sequences[0], expected[:end]), f"{kind}: tokens part from generate"
    return heads


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_heads_for_a_torchao_quantized_lm_head(kind):
    from heads.checkpoint import BaseIdentity, lm_head_weight

    model = torchao_model("int8-weight-only", lm_head=True)
    plain = sharp_float32_model()
    assert type(model.lm_head.weight).__name__ == "Int8Tensor"
    # the base the heads record is the plain model's up to int8 rounding: heads trained on it attach to this one
    base = BaseIdentity.of(model)
    BaseIdentity.of(plain).check_matches(base)
    assert base.signature != BaseIdentity.of(plain).signature  # (read from the int8 values, not a copy)
    ids = torch.tensor([0, 7, 95])
    assert torch.equal(lm_head_weight(model, ids), model.lm_head.weight.dequantize()[ids])
    heads = assert_fresh_heads_run(model, kind, draft_vocab=torch.arange(0, 96, 2))  # (a draft vocabulary: its rows)
    if kind == "medusa":
        assert torch.equal(heads.lm_heads[0].weight, model.lm_head.weight.dequantize())


@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
@pytest.mark.parametrize("bits", [8, 4])
def test_heads_for_a_bitsandbytes_quantized_lm_head(saved_model, bits, kind):
    """Heads read the vocabulary size from the layer (a 4-bit weight is packed [vocab * hidden / 2, 1]) and the
    dequantized weight; a draft vocabulary through the base's LM head is refused (`test_bitsandbytes_with_a_...`)."""
    from heads.checkpoint import BaseIdentity, lm_head_weight

    model = bnb_model(saved_model, bits, lm_head=True)
    model(torch.tensor([[1, 2, 3]]))  # (a first forward: where bitsandbytes repacks 4-bit weights, it does so now)
    base = BaseIdentity.of(model)
    assert (base.vocab_size, base.hidden_size) == (96, 64)
    plain = sharp_float32_model()
    error = (lm_head_weight(model) - plain.lm_head.weight).abs()
    if bits == 8:  # (4-bit rounding is coarser than the base check's tolerance: the plain model's heads need
        # check_base=False there)
        assert error.max() < 0.01
        BaseIdentity.of(plain).check_matches(base)
    else:
        assert (error <= bnb_4bit_error_bound(plain.lm_head.weight, model.lm_head.weight.quant_state)).all()
    assert_fresh_heads_run(model, kind, draft_vocab=torch.arange(0, 96, 2) if kind == "eagle3" else None,
                           near_tie=bnb_near_tie(model, bits))


def bnb_4bit_error_bound(weight: torch.Tensor, state) -> torch.Tensor:
    """[rows, cols] the most a 4-bit value of `weight` can be off: half the widest gap of the code table, times its
    block's absolute maximum, plus the block scale's rounding where the CPU path keeps it in bfloat16."""
    code = state.code.float().sort().values
    half_gap = float((code[1:] - code[:-1]).max()) / 2
    blocks = weight.detach().reshape(-1, state.blocksize).abs().amax(dim=-1, keepdim=True)  # [blocks, 1]
    scale_rounding = 2.0 ** -8 if getattr(state, "packing_format_for_cpu", False) else 1e-6
    return (blocks * (half_gap + scale_rounding) + 1e-6).expand(-1, state.blocksize).reshape(weight.shape)


def bnb_4bit_products(model) -> torch.dtype:
    """The dtype bitsandbytes' 4-bit layers of `model` multiply in on this CPU: bfloat16 where it has AVX512-BF16 (the
    layers repack their weights for that kernel), float32 elsewhere. CPU-dependent by bitsandbytes' design."""
    layers = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
    return torch.bfloat16 if any(getattr(m, "support_avx512bf16_for_cpu", False) for m in layers) else torch.float32


def bnb_near_tie(model, bits: int) -> float:
    if bits == 8:
        return INT8_ACTIVATIONS_NEAR_TIE
    return BFLOAT16_NEAR_TIE if bnb_4bit_products(model) == torch.bfloat16 else FLOAT32_NEAR_TIE


def test_from_pretrained_passes_a_quantization_config_through(tmp_path):
    torchao()
    from transformers import TorchAoConfig

    sharp_float32_model().save_pretrained(tmp_path)
    spec = SelfSpecModel.from_pretrained(tmp_path, drafter="ngram",
                                         quantization_config=TorchAoConfig(torchao_config("int8-weight-only")))
    model = spec.model
    assert type(model.model.layers[0].self_attn.q_proj.weight).__name__ == "Int8Tensor"
    assert type(model.lm_head.weight) is torch.nn.Parameter  # transformers keeps the LM head unquantized
    assert_greedy_equals_generate(model, spec, "from_pretrained with TorchAoConfig")


def test_the_few_row_kernel_leaves_torchao_layers_to_their_own_forward(needs_kernel, caplog):
    from selfspec.kernel import few_row_linear
    from selfspec.kernel.few_row_linear import FewRowLinears

    model = torchao_model("int8-weight-only")
    few_row_linear._log_left_alone.cache_clear()
    with caplog.at_level(logging.INFO, logger=few_row_linear.__name__):
        linears = FewRowLinears(model)
        FewRowLinears(model)  # (said once)
    assert [layer for layer, _ in linears.forwards] == [model.lm_head]  # the one plain float32 layer
    said = [r.getMessage() for r in caplog.records if "leaves them to their own forward" in r.getMessage()]
    assert len(said) == 1 and "14 linear layers hold Int8Tensor weights" in said[0]
    spec = SelfSpecModel(model, drafter="ngram", few_row_kernel="on")
    assert spec.few_row_kernel
    assert_greedy_equals_generate(model, spec, "torchao with the few-row kernel on")


def test_weight_counts_and_memory_of_torchao_weights():
    from selfspec.kernel.quantized import resident_bytes, weight_count

    plain = sharp_float32_model()
    model = torchao_model("int8-weight-only")
    assert weight_count(model) == weight_count(plain)
    linear_weights = sum(m.weight.numel() for m in plain.model.layers.modules() if isinstance(m, torch.nn.Linear))
    # int8 decoder weights: 3 bytes a weight fewer, plus one float32 scale a row
    assert resident_bytes(plain) - resident_bytes(model) > 2.5 * linear_weights


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharp-llama")
    sharp_float32_model().save_pretrained(path)
    return str(path)


def bnb_model(path: str, bits: int, lm_head: bool = False):
    """The sharp tiny Llama loaded by transformers with bitsandbytes' `bits`-bit linears (and LM head with
    `lm_head`; transformers keeps it unquantized by default), float32 activations, on the CPU; once per module."""
    bitsandbytes()
    return _bnb_model(path, bits, lm_head)


@lru_cache(maxsize=None)
def _bnb_model(path: str, bits: int, lm_head: bool):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    skip = {"llm_int8_skip_modules": ["no-module-has-this-name"]} if lm_head else {}
    config = (BitsAndBytesConfig(load_in_8bit=True, **skip) if bits == 8 else
              BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32, **skip))
    return AutoModelForCausalLM.from_pretrained(path, quantization_config=config, dtype=torch.float32,
                                                device_map="cpu").eval()


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(("drafter", "tree_size"), CASES, ids=IDS)
def test_bitsandbytes_greedy_equals_the_quantized_models_generate(saved_model, bits, drafter, tree_size):
    model = bnb_model(saved_model, bits)
    assert type(model.model.layers[0].mlp.down_proj).__name__ == ("Linear8bitLt" if bits == 8 else "Linear4bit")
    spec = SelfSpecModel(model, tree_size=tree_size, **drafter_options(model, drafter))
    assert spec.tree_size == (tree_size or 0)
    assert_greedy_equals_generate(model, spec, f"bitsandbytes {bits}-bit ({bnb_4bit_products(model)} products), "
                                  f"{drafter}, tree {tree_size}", near_tie=bnb_near_tie(model, bits))


@pytest.mark.parametrize("bits", [8, 4])
def test_bitsandbytes_with_a_quantized_lm_head(saved_model, bits):
    from selfspec.drafters.base import projection_weights

    model = bnb_model(saved_model, bits, lm_head=True)
    assert type(model.lm_head).__name__ == ("Linear8bitLt" if bits == 8 else "Linear4bit")
    spec = SelfSpecModel(model, drafter="ngram")
    assert (spec.target.vocab_size, spec.target.hidden_size, spec.target.dtype) == (96, 64, torch.float32)
    assert projection_weights(model, None) == 96 * 64  # (a 4-bit weight is stored packed, [96 * 64 / 2, 1])
    assert_greedy_equals_generate(model, spec, f"bitsandbytes {bits}-bit LM head ({bnb_4bit_products(model)} products), "
                                  "ngram", near_tie=bnb_near_tie(model, bits))
    with pytest.raises(NotImplementedError, match="draft vocabulary reads rows of the LM head"):
        spec.target.lm_head_rows(torch.arange(8))


@pytest.mark.parametrize("quant_type", ["fp4", "nf4"])
def test_lm_head_weight_reads_bitsandbytes_cpu_packed_4bit_weights(quant_type):
    """On an AVX512-BF16 CPU a 4-bit LM head is repacked at its first forward (bitsandbytes' CPU layout); its values
    read the same as before the repacking, up to the bfloat16 block scales. The repacking itself is plain torch, so
    this runs on every CPU (the repacking in a model's forward only happens on AVX512-BF16 ones)."""
    bitsandbytes()
    import copy

    import bitsandbytes.functional as bnb_functional

    from heads.checkpoint import _bnb_cpu_packed_4bit

    repack = getattr(bnb_functional, "_convert_weight_packed_for_cpu", None)
    if repack is None:
        pytest.skip("this bitsandbytes has no CPU repacking of 4-bit weights")
    weight = sharp_float32_model().lm_head.weight.detach()  # [96, 64]
    codes, state = bnb_functional.quantize_4bit(weight, quant_type=quant_type, blocksize=64)
    plain = bnb_functional.dequantize_4bit(codes, state)
    packed, packed_state = repack(codes.clone(), copy.deepcopy(state))
    assert packed_state.packing_format_for_cpu and packed.shape == (96, 32)
    read = _bnb_cpu_packed_4bit(packed, packed_state, 96, 64)
    assert ((read - plain).abs() <= plain.abs() * 2.0 ** -8 + 1e-7).all()
    assert (read - plain).abs().max() > 0  # (the block scales did round: bfloat16, not a copy of the plain values)
    assert (read - weight).abs().max() < (plain - weight).abs().max() + 0.05


def test_bitsandbytes_4bit_float32_path_on_every_cpu(saved_model):
    """The float32 4-bit path, which AVX512-BF16 CPUs skip by default, turned on here so every CPU runs it: the LM head
    and the decoder dequantize to float32, and greedy speculation equals that model's generate."""
    bnb_model(saved_model, 4)  # (skips where bitsandbytes does not run)
    model = _bnb_model.__wrapped__(saved_model, 4, True)  # (a model of its own: its layers are changed below)
    for layer in model.modules():
        if type(layer).__name__ == "Linear4bit":
            layer.support_avx512bf16_for_cpu = False
    assert bnb_4bit_products(model) == torch.float32
    spec = SelfSpecModel(model, drafter="ngram")
    assert_greedy_equals_generate(model, spec, "bitsandbytes 4-bit, float32 products, ngram", near_tie=FLOAT32_NEAR_TIE)
    assert not getattr(model.lm_head.weight.quant_state, "packing_format_for_cpu", False)
