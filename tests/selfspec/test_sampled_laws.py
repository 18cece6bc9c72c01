"""The sampled law in the cases `test_engine_sampling.py` does not cover: an EOS or a stop string inside a step, a
sliding-window family, GPT-2, early exit without shared work, half precision, and num_draft_tokens="auto".

Each test compares 1,000 engine samples of a short continuation (vocabulary of 4) with the law computed by
enumeration, and asserts that it exercised what it names. Each docstring names the planted library bug it was
seen to fail for (at this sample count: p-values below 1e-6, or a sample the law gives probability 0).
"""
from __future__ import annotations

import torch
import transformers

from selfspec import SelfSpecModel
from selfspec.sampling import SamplingConfig
from tests.conftest import tiny_model
from tests.selfspec.exactness import exact_continuation_law, law_pvalue
from tests.selfspec.exercised import assert_exercised
from tests.selfspec.scripted_time import scripted_engine_clock
from tests.selfspec.test_engine_sampling import PROMPT, engine_samples, randomized_heads, sharp_model

NUM_SAMPLES = 1000
T1 = SamplingConfig(do_sample=True)


def ended_inside_a_step(stats) -> bool:
    """The stop token was an accepted draft (cut mid-step), not the step's recovered/bonus token."""
    return stats.new_tokens < stats.target_forwards + stats.accepted


def test_eos_inside_a_step():
    """EOS (token 0) among a step's accepted drafts ends generation right after it; the law is the model's law of
    continuations stopped at their first EOS.
    Catches (planted): EOS looked for only at a step's first token (`StopCondition._first_stop`)."""
    model = sharp_model()
    spec = SelfSpecModel(model, heads=randomized_heads(model))
    law = exact_continuation_law(model, PROMPT, 4, T1, ends=lambda c: c[-1] == 0)
    samples, stats = engine_samples(spec, T1, num_samples=NUM_SAMPLES, eos_token_id=[0])
    assert law_pvalue(samples, law) > 1e-3
    assert sum(ended_inside_a_step(s) for s in stats) > 20, "EOS was (almost) never an accepted draft"


def letter_tokenizer():
    """One letter per token: a b c d are ids 0..3 (the model's vocabulary), so stop strings span tokens and the law
    is easy to enumerate. ("e" and "f" exist only because the stop-string matcher tokenizes "abcdef".)"""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({c: i for i, c in enumerate("abcdef")}, unk_token="a"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")  # one token per character
    tokenizer.decoder = decoders.Fuse()  # "a" "b" -> "ab"
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_stop_string_inside_a_step():
    """The stop string "bd" (two tokens, possibly begun in the prompt, which ends in "b") completed by an accepted
    draft ends generation after that token.
    Catches (planted): stop strings matched only at a step's last token (`StopStrings.first_match`)."""
    model = sharp_model()
    spec = SelfSpecModel(model, heads=randomized_heads(model))
    spec.tokenizer = letter_tokenizer()  # (set after wrapping: its e and f exceed the model's 4 ids, which the wrapper
    # refuses from a tokenizer in general; here the model never emits them, the stop-string matcher only needs them)
    prompt = torch.tensor([[3, 1, 2, 3, 1]])  # "dbcdb"
    letters = "abcd"

    def ends(continuation):
        return "".join(letters[t] for t in prompt[0].tolist() + list(continuation)).endswith("bd")

    law = exact_continuation_law(model, prompt, 4, T1, ends=ends)
    samples, stats = engine_samples(spec, T1, num_samples=NUM_SAMPLES, prompt=prompt, stop_strings=["bd"])
    assert law_pvalue(samples, law) > 1e-3
    assert sum(ended_inside_a_step(s) for s in stats) > 5, "a stop string was (almost) never completed by a draft"
    assert (3,) in samples  # ... and one begun in the prompt ("b" + "d") was honoured


def sliding_window_model(window=3):
    config = transformers.MistralConfig(
        vocab_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=window, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model


def test_sliding_window_family_with_early_exit():
    """Mistral with a 3-token window past a 5-token prompt: early-exit drafts write the first layer, rejected ones are
    rolled back, and each window is re-trimmed; the law is unchanged.
    Catches (planted): rollback that does not keep the tokens a sliding window dropped (`activate_past_recording`
    removed from `KVCache`)."""
    model = sliding_window_model()
    spec = SelfSpecModel(model, drafter="early_exit", exit_layer=1)
    law = exact_continuation_law(model, PROMPT, 4, T1)
    samples, _ = engine_samples(spec, T1, num_samples=NUM_SAMPLES)
    assert law_pvalue(samples, law) > 1e-3


def test_gpt2_with_medusa():
    """GPT-2 (learned absolute positions, Conv1D layers, a tied LM head).
    Catches (planted): the recovered token sampled from the target row instead of the residual."""
    model = tiny_model("gpt2", vocab_size=4, hidden=16, num_layers=1, seed=0)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight * 6.0)  # untied: sharper, same embeddings
    spec = SelfSpecModel(model, heads=randomized_heads(model))
    law = exact_continuation_law(model, PROMPT, 4, T1)
    samples, _ = engine_samples(spec, T1, num_samples=NUM_SAMPLES)
    assert law_pvalue(samples, law) > 1e-3


def test_early_exit_without_shared_work():
    """share_work=False, the naive reference: drafting's keys and values are dropped and verification recomputes
    every layer.
    Catches (planted): the naive path not rolling the drafted layers' cache back (`cache.rollback` skipped)."""
    model = tiny_model("llama", vocab_size=4, hidden=16, num_layers=2, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    spec = SelfSpecModel(model, drafter="early_exit", exit_layer=1, share_work=False)
    law = exact_continuation_law(model, PROMPT, 4, T1)
    samples, _ = engine_samples(spec, T1, num_samples=NUM_SAMPLES)
    assert law_pvalue(samples, law) > 1e-3


def test_half_precision():
    """A bfloat16 model: the law is the bfloat16 model's own (its full forwards), which the engine's incremental
    bfloat16 forwards and float32 verification must follow within what 1,000 samples can see.
    Catches (planted): the recovered token sampled from the target row instead of the residual."""
    model = sharp_model()
    heads = randomized_heads(model)
    model.to(torch.bfloat16)
    spec = SelfSpecModel(model, heads=heads)  # the heads follow the model's dtype
    assert next(spec.heads.parameters()).dtype == torch.bfloat16
    law = exact_continuation_law(model, PROMPT, 4, T1)
    samples, _ = engine_samples(spec, T1, num_samples=NUM_SAMPLES)
    assert law_pvalue(samples, law) > 1e-3


def test_auto_draft_length():
    """num_draft_tokens="auto": the number drafted changes from step to step, never the law.
    Catches (planted): the recovered token sampled from the target row instead of the residual."""
    model = sharp_model()
    spec = SelfSpecModel(model, heads=randomized_heads(model))
    # Priced at their share of this tiny model's weights the heads would never pay (seeded "auto" plans without
    # timings); priced free, "auto" drafts, and its k still varies with acceptance.
    spec.drafter.draft_cost = 0.0
    law = exact_continuation_law(model, PROMPT, 4, T1)
    samples, stats = engine_samples(spec, T1, num_draft_tokens="auto", num_samples=NUM_SAMPLES)
    assert law_pvalue(samples, law) > 1e-3


def test_auto_draft_length_planning_from_step_times():
    """Without a seed or generator, "auto" plans from the verify-cost curve it learns from timed steps (with a seed it
    plans from the prior only, as above). On a scripted clock (each forward of n tokens takes 1 + 0.1 (n - 1) s) the
    run is deterministic under torch.manual_seed, k varies, and the law is unchanged.
    Catches (planted): the recovered token sampled from the target row instead of the residual."""
    model = sharp_model()
    spec = SelfSpecModel(model, heads=randomized_heads(model))
    spec.drafter.draft_cost = 0.0  # as above: the scripted clock charges nothing for drafting
    scripted_engine_clock(spec, lambda num_tokens: 1.0 + 0.1 * (num_tokens - 1))
    law = exact_continuation_law(model, PROMPT, 4, T1)
    torch.manual_seed(0)
    samples, stats = [], []
    for _ in range(NUM_SAMPLES):
        out = spec.generate(PROMPT, max_new_tokens=4, do_sample=True, num_draft_tokens="auto", eos_token_id=[])
        samples.append(tuple(out.sequences[0, PROMPT.shape[1]:].tolist()))
        stats.append(out.stats)
    assert_exercised(stats)
    assert len({s.drafted for s in stats}) > 1  # the number drafted varied
    assert spec.verify_cost().num_observed > 0  # the curve was learned from the (scripted) step times
    assert law_pvalue(samples, law) > 1e-3
