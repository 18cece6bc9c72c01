"""What only EAGLE heads of the "eagle3" layout have (the speculators format's EAGLE-3: fc over the feature layers,
layer 0 over [norm(embedding); norm(hidden)], its own LM head over a draft vocabulary), through the one EAGLE drafter:
draft probabilities zero outside the draft vocabulary (drafting over the whole one refused), and a head that went
through the speculators format drafts exactly as before. Greedy identity (chain, tree, a batch) and the sampled law
(with a planted misreported-draft-probs bug) run for both layouts in test_eagle3.py."""
import pytest
import torch

from heads.eagle import EagleHead
from selfspec import SelfSpecModel
from selfspec.drafters.base import DraftContext
from selfspec.drafters.eagle import EagleDrafter
from selfspec.sampler import Sampler
from selfspec.sampling import SamplingConfig
from selfspec.target import TargetModel
from tests.conftest import random_prompt
from tests.selfspec.drafters.test_eagle3 import LAYERS, model_and_trained_head
from tests.selfspec.exercised import assert_exercised


@pytest.fixture(scope="module")
def model_and_head():
    """The "eagle3" head test_eagle3.py drafts with (greedy identity, the sampled law) for either layout."""
    return model_and_trained_head("eagle3")


def test_a_head_through_the_speculators_format_drafts_the_same(model_and_head, tmp_path):
    model, head = model_and_head
    head.save_pretrained(tmp_path, format="speculators", model=model, verifier_name_or_path="org/tiny-llama")
    loaded = EagleHead.from_pretrained(tmp_path, model=model)
    outputs = []
    for drafting in (head, loaded):
        spec = SelfSpecModel(model, heads=drafting, tree_size=None)
        outputs.append([spec.generate(random_prompt(8, seed=s), max_new_tokens=30, num_draft_tokens=3,
                                      eos_token_id=[]) for s in range(2)])
    for before, after in zip(*outputs):
        assert torch.equal(before.sequences, after.sequences)
        assert (before.stats.drafted, before.stats.accepted) == (after.stats.drafted, after.stats.accepted)
    assert_exercised([o.stats for o in outputs[1]], what="eagle3 layout from the speculators format")


def test_draft_probs_are_zero_outside_the_draft_vocabulary_and_full_is_refused(model_and_head):
    model, head = model_and_head
    target = TargetModel(model)
    target.set_feature_layers(LAYERS)
    drafter = EagleDrafter(target, head)
    tokens = random_prompt(8)[0]
    cache = target.new_cache()
    with torch.no_grad():
        hidden = target.forward(tokens[:-1], cache)  # [7, 3H] the committed positions; the last token is pending
    sampling = SamplingConfig(do_sample=True, temperature=0.9)
    context = DraftContext(token_ids=tokens, hidden_state=hidden[-1], hidden_states=hidden, num_draft_tokens=3,
                           sampler=Sampler(sampling, generator=torch.Generator().manual_seed(0)), target=target,
                           cache=cache)
    with torch.no_grad():  # as the engine drafts
        draft = drafter.propose(context)
    assert draft.num_draft_tokens == 3 and torch.isin(draft.tokens, head.draft_vocab).all()
    outside = torch.ones(target.vocab_size, dtype=torch.bool).index_fill_(0, head.draft_vocab, False)
    assert float(draft.probs[:, outside].abs().max()) == 0.0
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(3, dtype=draft.probs.dtype))
    with pytest.raises(ValueError, match="cannot draft over the whole vocabulary"):
        EagleDrafter(target, head, draft_vocab="full")
