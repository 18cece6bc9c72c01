"""Bad input gets a clear error that says what is wrong and how to fix it, never silent garbage."""
import pytest
import torch
import transformers

from heads import MedusaHeads
from selfspec import SelfSpecModel
from tests.conftest import random_prompt, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def spec(model):
    return SelfSpecModel(model, drafter="ngram")


def test_heads_for_another_hidden_size(model):
    other = tiny_model("llama", hidden=64)
    with pytest.raises(ValueError, match="hidden size 64 but the model has 32"):
        SelfSpecModel(model, heads=MedusaHeads.for_model(other))


def test_heads_for_another_vocabulary(model):
    other = tiny_model("llama", vocab_size=120)
    with pytest.raises(ValueError, match="vocabulary of 120 tokens"):
        SelfSpecModel(model, heads=MedusaHeads.for_model(other))


def test_heads_for_another_base_of_the_same_shape(model, tmp_path):
    other = tiny_model("llama", seed=123)
    heads = MedusaHeads.for_model(other)
    with pytest.raises(ValueError, match="different base model"):
        SelfSpecModel(model, heads=heads)
    heads.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="different base model"):
        SelfSpecModel(model, heads=str(tmp_path))
    MedusaHeads.from_pretrained(tmp_path, model=model, check_base=False)  # an explicit override works


def test_heads_survive_a_dtype_change_of_their_own_base(model, tmp_path):
    MedusaHeads.for_model(model).save_pretrained(tmp_path)
    assert MedusaHeads.from_pretrained(tmp_path, model=tiny_model("llama", dtype=torch.bfloat16)).num_heads == 4


def test_not_a_heads_directory(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a heads directory"):
        SelfSpecModel(model, heads=str(tmp_path))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(do_sample=True, temperature=0.0), "temperature"),
        (dict(do_sample=True, top_p=2.0), "top_p"),
        (dict(do_sample=True, top_k=-3), "top_k"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(num_draft_tokens=-1), "num_draft_tokens"),
        (dict(num_draft_tokens=2.5), "num_draft_tokens"),
    ],
)
def test_invalid_generation_parameters(spec, kwargs, message):
    with pytest.raises(ValueError, match=message):
        spec.generate(random_prompt(5), **kwargs)


def test_prompt_past_the_context_window():
    spec = SelfSpecModel(tiny_model("llama", max_positions=64), drafter="ngram")
    with pytest.raises(ValueError, match="context window of 64"):
        spec.generate(random_prompt(60), max_new_tokens=10)
    with pytest.raises(ValueError, match="context window of 64"):
        spec.generate(random_prompt(70), max_new_tokens=1)
    assert spec.generate(random_prompt(54), max_new_tokens=10, eos_token_id=[]).sequences.shape == (1, 64)


def test_a_padded_batch_tensor_is_refused_with_the_list_api_named(spec):
    with pytest.raises(ValueError, match="Pass its attention_mask too .* or several prompts as a list"):
        spec.generate(torch.randint(3, 90, (2, 5)))


def test_ids_outside_the_vocabulary(spec):
    with pytest.raises(ValueError, match="another model's tokenizer"):
        spec.generate(torch.tensor([[5, 96]]))


def test_empty_prompt(spec):
    with pytest.raises(ValueError, match="non-empty"):
        spec.generate(torch.tensor([[]], dtype=torch.long))


def test_string_prompt_without_tokenizer(spec):
    with pytest.raises(ValueError, match="needs a tokenizer"):
        spec.generate("def main():")


def test_medusa_without_heads(model):
    with pytest.raises(ValueError, match="needs heads"):
        SelfSpecModel(model, drafter="medusa")


def test_unknown_drafter(model):
    with pytest.raises(ValueError, match="unknown drafter 'lookahead'"):
        SelfSpecModel(model, drafter="lookahead")


@pytest.mark.parametrize("drafter, options, says", [
    # a generate() argument given to the wrapper: where it belongs
    ("medusa", {"num_draft_tokens": 4}, r"num_draft_tokens: not an option of drafter='medusa' \(it takes "
     r"min_draft_confidence, tree_top_k\); num_draft_tokens is an argument of generate\(\) and stream\(\)"),
    # another drafter's option: which drafter takes it (the default drafter without heads is n-gram lookup)
    (None, {"exit_layer": 1}, r"not an option of drafter='ngram' \(it takes max_ngram_size, min_ngram_size\); "
     "exit_layer is an option of drafter='early_exit'"),
    ("none", {"max_ngram_size": 2}, r"drafter='none' \(it takes none\)"),
    ("eagle", {"tree_topk": 2}, r"got tree_topk: not an option of drafter='eagle' \(it takes min_draft_confidence, "
     r"tree_top_k\)$"),
])
def test_an_option_the_drafter_does_not_take_is_named_with_what_it_takes(model, drafter, options, says):
    heads = MedusaHeads.for_model(model) if drafter == "medusa" else None
    with pytest.raises(ValueError, match=says):
        SelfSpecModel(model, drafter=drafter, heads=heads, **options)


def test_eagle_without_a_head_says_how_to_get_one(model):
    with pytest.raises(ValueError, match="training.heads --kind eagle"):
        SelfSpecModel(model, drafter="eagle")


def test_drafter_object_without_the_interface(model):
    class HalfDrafter:
        def propose(self, context):
            raise AssertionError

    with pytest.raises(TypeError, match="observe"):
        SelfSpecModel(model, drafter=HalfDrafter())


def test_an_architecture_whose_cache_cannot_roll_back():
    config = transformers.MambaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, state_size=4)
    with pytest.raises(NotImplementedError, match="cannot be rolled back"):
        SelfSpecModel(transformers.MambaForCausalLM(config), drafter="ngram")


def test_not_a_causal_lm():
    with pytest.raises(TypeError, match="causal LM"):
        SelfSpecModel(torch.nn.Linear(3, 3), drafter="ngram")
