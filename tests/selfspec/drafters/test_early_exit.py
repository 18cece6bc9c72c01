"""Early exit is exact (greedy and sampled), shares the cache and the work with verification, and fails clearly."""
from collections import Counter

import pytest
import torch
import transformers

import selfspec.cache
from heads.exit_adapter import ExitAdapter
from selfspec import SelfSpecModel
from selfspec.sampling import SamplingConfig, logits_to_probs
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.exactness import exact_continuation_law, law_pvalue
from selfspec.drafters.early_exit import EarlyExitDrafter
from tests.selfspec.exercised import RecordingDrafter, assert_exercised, exit_confidences, exit_probs, scrambled_model, sharpened

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "gpt2"]


def randomized_adapter(model, exit_layer, seed=0):
    """An adapter with random (not identity) blocks, so it changes the drafts."""
    adapter = ExitAdapter.for_model(model, exit_layer)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return adapter


def reference(model, prompt, max_new_tokens):
    return model.generate(
        prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=2,
        attention_mask=torch.ones_like(prompt),
    )


def early_exit(model, exit_layer, adapter=None, min_draft_confidence=0.0, share_work=True):
    """An engine whose early-exit drafter records each step's asked/proposed counts (`engine.drafter.steps`)."""
    target = SelfSpecModel(model, drafter="none").target
    drafter = EarlyExitDrafter(target, exit_layer, adapter, min_draft_confidence, share_work)
    return SelfSpecModel(model, drafter=RecordingDrafter(drafter))


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_model_generate(family):
    """Every case drafts and has drafts accepted; some are rejected; the confidence case (threshold: the median
    confidence of layer 1's drafts along this very output) stops chains midway and before the first draft.
    Catches (planted): the confidence stop keeping one exit state too few (verification cannot resume)."""
    model = sharpened(scrambled_model(family, num_layers=4, seed=1), 4.0)  # same argmax, confident enough to stop
    prompt = random_prompt(9, seed=2)
    expected = reference(model, prompt, 30)
    median_confidence = float(exit_confidences(SelfSpecModel(model, drafter="none").target, expected[0], 1).median())
    cases = [  # (exit_layer, num_draft_tokens, adapter, min_draft_confidence)
        (1, 1, None, 0.0), (2, 3, None, 0.0), (3, 5, None, 0.0), (2, 4, randomized_adapter(model, 2), 0.0),
        (1, 6, None, median_confidence),
    ]
    all_stats = []
    for exit_layer, k, adapter, confidence in cases:
        spec = early_exit(model, exit_layer, adapter, confidence)
        out = spec.generate(prompt, max_new_tokens=30, num_draft_tokens=k, eos_token_id=[])
        case = (exit_layer, k, adapter is not None, confidence)
        assert torch.equal(out.sequences, expected), case
        assert out.stats.accepted + out.stats.target_forwards == 30
        assert_exercised(out.stats, rejected=False, what=str(case))
        all_stats.append(out.stats)
    assert_exercised(all_stats)  # the drafts were not all trivially right
    assert spec.drafter.stopped_mid_chain() > 0 and spec.drafter.stopped_at_once() > 0, spec.drafter.steps


def trained_adapter(model, exit_layer, sequences, steps=150, lr=3e-2):
    """An exit adapter fitted for a few dozen Adam steps so that the exit layer's distribution matches the model's
    (soft cross-entropy on `sequences`); well under a second on a tiny model."""
    target = SelfSpecModel(model, drafter="none").target
    with torch.no_grad():
        exits = torch.cat([target.exit_forward(seq, target.new_cache(), exit_layer) for seq in sequences])  # [n, hidden]
        wanted = torch.cat([model(seq[None]).logits[0] for seq in sequences]).softmax(dim=-1)  # [n, vocab]
    torch.manual_seed(0)
    adapter = ExitAdapter.for_model(model, exit_layer)
    optimizer = torch.optim.Adam(adapter.parameters(), lr=lr)
    norm, lm_weight = model.get_decoder().norm, model.get_output_embeddings().weight.detach()
    for _ in range(steps):
        logits = norm(adapter(exits)) @ lm_weight.T
        loss = -(wanted * logits.log_softmax(dim=-1)).sum(dim=-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return adapter.eval().requires_grad_(False)


def test_a_trained_exit_adapter_drafts_better_inside_the_engine():
    """An adapter trained to map layer 1 towards the model's output makes early-exit drafts accepted more often than
    plain early exit (a fresh adapter is the identity), and the output stays the model's own.
    Catches (planted): the drafter not applying its adapter (`_adapt` returning the exit state unchanged)."""
    model = scrambled_model("llama", num_layers=2, seed=5)
    prompt = random_prompt(9, seed=24)
    expected = reference(model, prompt, 40)
    adapter = trained_adapter(model, 1, [expected[0]])  # on the model's own output: a tiny one generalises little
    accepted = {}
    for name, candidate in (("fresh", ExitAdapter.for_model(model, 1)), ("trained", adapter)):
        spec = SelfSpecModel(model, drafter="early_exit", adapter=candidate)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=3, eos_token_id=[])
        assert torch.equal(out.sequences, expected), name
        assert_exercised(out.stats, accepted=name == "trained", what=name)
        accepted[name] = out.stats.acceptance_rate
    assert accepted["trained"] > accepted["fresh"] + 0.1, accepted


def test_adapter_from_a_directory(tmp_path):
    model = tiny_model("llama", num_layers=3)
    randomized_adapter(model, 2).save_pretrained(tmp_path)
    spec = SelfSpecModel(model, drafter="early_exit", adapter=str(tmp_path))  # exit_layer comes from the adapter
    assert spec.drafter.exit_layer == 2
    prompt = random_prompt(7, seed=3)
    out = spec.generate(prompt, max_new_tokens=20, num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(out.sequences, reference(model, prompt, 20))
    assert_exercised(out.stats, accepted=False)


def test_sampled_early_exit_follows_the_model_law():
    """Engine samples match the exact law of a 4-token continuation (vocabulary of 6, top-3: 81 outcomes). Drafts of
    two tokens test the autoregressive draft law; 1000 samples catch draft_probs misreported as q**0.3 (p ~ 1e-8).
    The confidence threshold is the median warped confidence of the adapted exit along a sample, so chains stop
    midway as well as before their first draft (a top-3 distribution never has a top probability below 1/3)."""
    model = tiny_model("llama", vocab_size=6, hidden=16, num_layers=2, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # sharp distributions, so a wrong draft law would show
    prompt = torch.tensor([[3, 4, 5, 3, 4]])
    sampling = SamplingConfig(do_sample=True, temperature=0.8, top_k=3)
    law = exact_continuation_law(model, prompt, 4, sampling)
    # The adapter and the confidence stop change which drafts are proposed and how many; never the law.
    adapter = randomized_adapter(model, 1)
    target = SelfSpecModel(model, drafter="none").target
    # The threshold lies between the confidence of a first draft and that of a second draft that can follow it, so
    # the first step (the only one of 2 drafts here) can draft one token and stop; other pending tokens stop at once.
    first = logits_to_probs(model(prompt).logits[0, -1:], sampling)[0].nonzero()[:, 0]  # the pending token's support
    pairs = []  # (first draft's confidence, a following second draft's confidence), where the second is lower
    for pending in first:
        context = torch.cat([prompt[0], pending[None]])
        probs = exit_probs(target, context, 1, adapter, sampling)[-1]
        for draft in probs.nonzero()[:, 0]:
            second = exit_confidences(target, torch.cat([context, draft[None]]), 1, adapter, sampling)[-1]
            if second < probs.max():
                pairs.append((float(probs.max()), float(second)))
    high, low = max(pairs, key=lambda pair: pair[0] - pair[1])
    threshold = (high + low) / 2
    spec = early_exit(model, 1, adapter, threshold)
    torch.manual_seed(0)  # unseeded calls: rejection sampling on torch's global generator
    samples, stats = [], []
    for _ in range(1000):
        out = spec.generate(
            prompt, max_new_tokens=4, do_sample=True, temperature=0.8, top_k=3, num_draft_tokens=2, eos_token_id=[],
        )
        samples.append(tuple(out.sequences[0, prompt.shape[1]:].tolist()))
        stats.append(out.stats)
    assert_exercised(stats)  # drafts were proposed, some kept, some rejected
    assert spec.drafter.stopped_mid_chain() > 0 and spec.drafter.stopped_at_once() > 0, Counter(spec.drafter.steps)
    assert law_pvalue(samples, law) > 1e-3


def test_after_each_rollback_every_layer_holds_plain_decodings_keys_and_values(monkeypatch):
    """Snapshot the cache after every rollback; it must equal a fresh prefill of the committed tokens, layer by layer,
    values included (not only lengths), also after rejected drafts."""
    model = tiny_model("qwen2", num_layers=4, seed=4)
    snapshots, rejections = [], []
    rollback = selfspec.cache.KVCache.rollback

    def recording_rollback(cache, length):
        rejections.append(max(layer.get_seq_length() for layer in cache.hf_cache.layers) - length)
        rollback(cache, length)
        snapshots.append([(layer.keys.clone(), layer.values.clone()) for layer in cache.hf_cache.layers])

    monkeypatch.setattr(selfspec.cache.KVCache, "rollback", recording_rollback)
    spec = SelfSpecModel(model, drafter="early_exit", exit_layer=2)
    prompt = random_prompt(8, seed=5)
    sequence = spec.generate(prompt, max_new_tokens=24, num_draft_tokens=4, eos_token_id=[]).sequences
    assert any(r > 0 for r in rejections), "the test needs rejected drafts"
    for snapshot in snapshots:
        length = snapshot[0][0].shape[-2]
        plain = spec.target.new_cache()
        with torch.no_grad():
            spec.target.forward(sequence[0, :length], plain)
        for (keys, values), layer in zip(snapshot, plain.hf_cache.layers):
            assert keys.shape[-2] == length
            torch.testing.assert_close(keys, layer.keys, rtol=0, atol=1e-10)
            torch.testing.assert_close(values, layer.values, rtol=0, atol=1e-10)


@pytest.mark.parametrize("family,share_work", [("llama", True), ("gpt2", True), ("llama", False)])
def test_verification_reuses_the_drafted_layers(family, share_work):
    """Count tokens through each decoder layer: the first exit_layer layers see every position once (drafting),
    the rest once (verifying), and no layer sees a position twice. The naive reference (share_work=False) instead
    runs the first layers twice over every draft: once drafting, once verifying."""
    model = tiny_model(family, num_layers=4, seed=6)
    spec = SelfSpecModel(model, drafter="early_exit", exit_layer=2, share_work=share_work)
    tokens_seen = [0] * 4
    layers = spec.target.parts.layers
    hooks = [
        layer.register_forward_hook(lambda module, args, out, i=i: tokens_seen.__setitem__(i, tokens_seen[i] + args[0].shape[1]))
        for i, layer in enumerate(layers)
    ]
    try:
        prompt = repetitive_prompt(10, seed=7)
        out = spec.generate(prompt, max_new_tokens=25, num_draft_tokens=4, eos_token_id=[])
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(out.sequences, reference(model, prompt, 25))
    assert_exercised(out.stats, rejected=False)
    steps = out.stats.target_forwards - 1
    once = prompt.shape[1] + steps + out.stats.drafted  # prefill; then the pending token and each draft, once
    assert tokens_seen == [once] * 4 if share_work else [once + out.stats.drafted] * 2 + [once] * 2


def test_confidence_threshold_drafts_fewer():
    """Thresholds 0, the median confidence of the exit layer's drafts along the output, and 1: fewer and fewer drafts,
    output unchanged; at the median, chains stop midway and drafts are still accepted.
    Catches (planted): the threshold ignored (drafted equal at 0 and at the median)."""
    model = sharpened(scrambled_model("llama", num_layers=4, seed=8), 4.0)
    prompt = random_prompt(9, seed=9)
    expected = reference(model, prompt, 20)
    median = float(exit_confidences(SelfSpecModel(model, drafter="none").target, expected[0], 2).median())
    drafted = {}
    for threshold in (0.0, median, 1.0):
        spec = early_exit(model, 2, min_draft_confidence=threshold)
        out = spec.generate(prompt, max_new_tokens=20, num_draft_tokens=4, eos_token_id=[])
        assert torch.equal(out.sequences, expected)
        drafted[threshold] = out.stats.drafted
        if threshold == median:
            assert_exercised(out.stats, rejected=False)
            assert spec.drafter.stopped_mid_chain() > 0, spec.drafter.steps
    assert drafted[0.0] > drafted[median] > drafted[1.0] == 0


@pytest.mark.parametrize("exit_layer", [0, 4, -1, 2.0, True, None])
def test_exit_layer_out_of_range_fails_clearly(exit_layer):
    model = tiny_model("llama", num_layers=4)
    with pytest.raises(ValueError, match=r"exit_layer.*1 \.\. 3"):
        SelfSpecModel(model, drafter="early_exit", exit_layer=exit_layer)


def test_draft_cost_is_the_share_of_weights_a_draft_token_meets():
    """The "auto" policy's prior cost of an early-exit draft token: the first L layers plus the LM head, over what a
    one-token forward multiplies by (every weight but the untied input embedding; a tiny untied model: its LM head
    weighs about as much as one layer here)."""
    model = tiny_model("llama", seed=4, num_layers=4)
    weights = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    layers, head = model.model.layers, weights(model.lm_head)
    costs = [SelfSpecModel(model, "early_exit", exit_layer=L).drafter.draft_cost for L in (1, 2, 3)]
    forward = weights(model) - weights(model.model.embed_tokens)
    expected = [(sum(weights(layers[i]) for i in range(L)) + head) / forward for L in (1, 2, 3)]
    assert costs == pytest.approx(expected) and 0 < costs[0] < costs[1] < costs[2] < 1


def test_an_adapter_for_another_layer_or_base_fails_clearly():
    model = tiny_model("llama", num_layers=4)
    with pytest.raises(ValueError, match="trained at exit_layer=1, not 2"):
        SelfSpecModel(model, drafter="early_exit", exit_layer=2, adapter=ExitAdapter.for_model(model, 1))
    other = tiny_model("llama", num_layers=4, seed=11)
    with pytest.raises(ValueError, match="different base model"):
        SelfSpecModel(model, drafter="early_exit", adapter=ExitAdapter.for_model(other, 2))


def test_an_adapter_module_follows_the_model_dtype():
    model = tiny_model("llama", num_layers=3)  # float64
    adapter = randomized_adapter(model, 1).to(torch.float32)
    spec = SelfSpecModel(model, drafter="early_exit", adapter=adapter)
    assert next(spec.drafter.adapter.parameters()).dtype == torch.float64
    prompt = random_prompt(7, seed=12)
    out = spec.generate(prompt, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(out.sequences, reference(model, prompt, 12))
    assert_exercised(out.stats, accepted=False)


def test_a_sliding_window_model_stays_exact_past_its_window():
    """Mistral with a 6-token window: layers briefly differ in length, rollback re-trims each window."""
    config = transformers.MistralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=6, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.get_decoder().layers.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.2)
    prompt = random_prompt(9, seed=2)
    expected = reference(model, prompt, 30)
    for exit_layer, k in [(1, 3), (2, 5)]:
        out = SelfSpecModel(model, drafter="early_exit", exit_layer=exit_layer).generate(
            prompt, max_new_tokens=30, num_draft_tokens=k, eos_token_id=[]
        )
        assert torch.equal(out.sequences, expected)
        assert_exercised(out.stats, what=f"exit layer {exit_layer}")  # rejections make rollback re-trim the windows
