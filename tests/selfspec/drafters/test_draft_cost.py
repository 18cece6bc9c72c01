"""What each drafter says one draft token costs (`draft_cost`, in one-token decodes): the share of the target's
weights it meets, where the "auto" draft length starts before timings (and where seeded sampling stays)."""
import pytest
import torch

from heads import MedusaHeads
from heads.eagle import EagleHead
from selfspec import SelfSpecModel
from selfspec.drafters.base import weight_share
from selfspec.engine import DecodeOptions
from selfspec.sampling import SamplingConfig
from tests.conftest import tiny_model


def weights(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("family", ["llama", "gemma"])  # untied, tied embeddings
def test_weight_share_counts_what_a_one_token_forward_multiplies_by(family):
    """Every parameter but an untied input embedding (one row of it is read); a tied one is the LM head, counted once."""
    model = tiny_model(family, seed=1, num_layers=2)
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert tied == (family == "gemma")
    forward = weights(model) - (0 if tied else weights(model.model.embed_tokens))
    assert weight_share(model, [model.lm_head]) == pytest.approx(weights(model.lm_head) / forward)
    assert weight_share(model, extra_weights=forward) == pytest.approx(1.0)


@pytest.mark.parametrize("draft_vocab", [None, torch.arange(0, 40, 2)])
def test_medusa_draft_cost_is_a_block_and_a_share_of_the_projection(draft_vocab):
    model = tiny_model("llama", seed=2, num_layers=2)
    heads = MedusaHeads.for_model(model, num_heads=4, draft_vocab=draft_vocab)
    spec = SelfSpecModel(model, heads=heads)
    hidden = model.config.hidden_size
    rows = (model.config.vocab_size if draft_vocab is None else draft_vocab.numel()) * hidden
    forward = weights(model) - weights(model.model.embed_tokens)
    assert spec.drafter.draft_cost == pytest.approx((weights(heads) // 4 + rows // 4) / forward)
    assert 0 < spec.drafter.draft_cost < 1


def test_medusa_heads_with_their_own_lm_heads_cost_a_head_each():
    model = tiny_model("llama", seed=2, num_layers=2)
    heads = MedusaHeads.for_model(model, num_heads=2, share_lm_head=False)
    forward = weights(model) - weights(model.model.embed_tokens)
    assert SelfSpecModel(model, heads=heads).drafter.draft_cost == pytest.approx(weights(heads) // 2 / forward)


@pytest.mark.parametrize("draft_vocab", [None, torch.arange(30)])
def test_eagle_draft_cost_is_the_head_and_the_rows_it_projects_onto(draft_vocab):
    model = tiny_model("llama", seed=3, num_layers=2)
    head = EagleHead.for_model(model, draft_vocab=draft_vocab)
    spec = SelfSpecModel(model, drafter="eagle", heads=head)
    rows = (model.config.vocab_size if draft_vocab is None else draft_vocab.numel()) * model.config.hidden_size
    forward = weights(model) - weights(model.model.embed_tokens)
    assert spec.drafter.draft_cost == pytest.approx((weights(head) + rows) / forward)


@pytest.mark.parametrize("seed", [None, 0])
def test_the_auto_policy_starts_from_the_drafters_cost(seed):
    """Seeded or not, "auto" prices a draft token at the drafter's draft_cost before any timing (planted: the
    engine not passing it on gives 0)."""
    model = tiny_model("llama", seed=2, num_layers=2)
    spec = SelfSpecModel(model, heads=MedusaHeads.for_model(model, num_heads=2))
    sampling = SamplingConfig(do_sample=seed is not None, temperature=1.0)
    options = DecodeOptions(max_new_tokens=4, sampling=sampling, num_draft_tokens="auto", seed=seed)
    policy = spec._draft_length_policy(options)
    assert policy.overhead.per_token == pytest.approx(spec.drafter.draft_cost) and spec.drafter.draft_cost > 0


@pytest.mark.parametrize("seed", [None, 0])
def test_the_auto_policy_plans_no_more_drafts_than_the_drafter_proposes(seed):
    """Medusa proposes at most one token per head: "auto" plans k up to its heads, not 8 (it once priced
    k up to 8 for 4 heads, and a batch's width had been capped by them already). Drafters without a cap keep 8.
    Catches (planted): the engine not passing the cap (8)."""
    model = tiny_model("llama", seed=2, num_layers=2)
    sampling = SamplingConfig(do_sample=seed is not None, temperature=1.0)
    options = DecodeOptions(max_new_tokens=4, sampling=sampling, num_draft_tokens="auto", seed=seed)
    medusa = SelfSpecModel(model, heads=MedusaHeads.for_model(model, num_heads=3))
    assert medusa.drafter.max_draft_tokens == 3 and medusa._draft_length_policy(options).max_draft_tokens == 3
    assert SelfSpecModel(model, drafter="ngram")._draft_length_policy(options).max_draft_tokens == 8
