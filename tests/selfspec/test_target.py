"""The target as the engine sees it: the wrap-time logits check refuses a model whose logits selfspec cannot
reproduce, and runs once per model (a wrapper built per call does not probe again)."""
import pytest
import torch

from selfspec import SelfSpecModel
from selfspec.target import TargetModel
from tests.conftest import tiny_model


def count_forwards(model) -> list:
    calls = []
    model.get_decoder().register_forward_hook(lambda module, args, output: calls.append(1))
    return calls


def test_logits_check_runs_once_per_model():
    """Catches (planted): the cache of checked models removed (every wrap probes again)."""
    model = tiny_model("llama", seed=1)
    calls = count_forwards(model)
    TargetModel(model)
    # the plain forward's probe (4 blocks, llama_forward.py), the model's own forward and selfspec's path (through the
    # decoder module: the counting hook asks for it)
    assert len(calls) == 6
    SelfSpecModel(model, "ngram")
    SelfSpecModel(model, "none")
    assert len(calls) == 6
    other = tiny_model("llama", seed=1)  # another model object is probed on its own
    other_calls = count_forwards(other)
    TargetModel(other)
    assert len(calls) == 6 and len(other_calls) == 6
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False).double()
    TargetModel(model)  # a replaced LM head is checked again (the decoder's plain forward is not built again)
    assert len(calls) == 8


def test_a_changed_final_transform_is_checked_again():
    model = tiny_model("llama", seed=2)
    TargetModel(model)
    calls = count_forwards(model)
    model.config.logit_scale = 0.5  # selfspec applies it; the model (Llama) does not
    with pytest.raises(TypeError, match="cannot reproduce LlamaForCausalLM's logits"):
        TargetModel(model)
    assert len(calls) == 2  # (the model's own forward and selfspec's path; the plain forward was built before)


def test_unknown_final_transform_is_refused_every_time():
    """A model that scales its logits where selfspec cannot see it; a refusal is never remembered as a pass."""
    model = tiny_model("llama", seed=3)
    base = type(model)

    class DoubledLogits(base):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2
            return out

    model.__class__ = DoubledLogits
    for _ in range(2):
        with pytest.raises(TypeError, match="cannot reproduce DoubledLogits's logits"):
            SelfSpecModel(model, "ngram")
    model.__class__ = base
    assert torch.is_tensor(TargetModel(model).logits(torch.zeros(1, model.config.hidden_size, dtype=torch.float64)))
