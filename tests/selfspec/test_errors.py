"""Bad input gets a clear error that says what is wrong and how to fix it, never silent garbage."""
import numpy as np
import pytest
import torch
import transformers

from heads import EagleHead, MedusaHeads
from selfspec import Draft, SelfSpecModel
from selfspec.drafters import NgramDrafter
from tests.conftest import VOCAB, random_prompt, tiny_model
from tests.selfspec.tiny_text import tiny_tokenizer


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


def test_the_misplaced_call_arguments_are_generates_and_streams():
    """CALL_ARGUMENTS (what the wrapper's errors call a generate() argument) is exactly their keyword arguments."""
    import inspect

    from selfspec.drafters import CALL_ARGUMENTS

    keywords = {name for method in (SelfSpecModel.generate, SelfSpecModel.stream)
                for name in inspect.signature(method).parameters} - {"self", "input_ids"}
    assert set(CALL_ARGUMENTS) == keywords


@pytest.mark.parametrize("drafter, options, says", [
    # a generate() argument given to the wrapper: where it belongs
    ("medusa", {"num_draft_tokens": 4}, r"num_draft_tokens: not an option of drafter='medusa' \(it takes "
     r"min_draft_confidence, tree_top_k\); num_draft_tokens is an argument of generate\(\) and stream\(\)"),
    # another drafter's option: which drafter takes it (the default drafter without heads is n-gram lookup)
    (None, {"exit_layer": 1}, r"not an option of drafter='ngram' \(it takes max_ngram_size, min_ngram_size\); "
     "exit_layer is an option of drafter='early_exit'"),
    ("none", {"max_ngram_size": 2}, r"drafter='none' \(it takes none\)"),
    ("eagle", {"tree_topk": 2}, r"got tree_topk: not an option of drafter='eagle' \(it takes min_draft_confidence, "
     r"tree_top_k, draft_vocab\)$"),
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


# -- wrapping and loading ----------------------------------------------------------------------------------

@pytest.mark.parametrize("keywords, error, says", [
    (dict(max_ngram_size=1), ValueError, r"got max_ngram_size, an option of drafter='ngram': pass it in "
     r"drafter_options: SelfSpecModel.from_pretrained\(path, drafter_options=\{'max_ngram_size': \.\.\.\}\)"),
    (dict(drafter="early_exit", exit_layer=1), ValueError, "got exit_layer, an option of drafter='early_exit'"),
    (dict(num_draft_tokens=4), ValueError, r"got num_draft_tokens, an argument of generate\(\) and stream\(\), not "
     r"of loading: spec.generate\(prompt, num_draft_tokens=\.\.\.\)"),
    (dict(eos_token_id=5), ValueError, r"got eos_token_id, an argument of generate\(\)"),  # transformers: silently
    (dict(tokenizer=object()), ValueError, r"loads the tokenizer saved with the model; to use another, load the "
     r"model and wrap it: SelfSpecModel\(model, tokenizer=\.\.\.\)"),
    (dict(drafter_options=[("max_ngram_size", 2)]), TypeError, "drafter_options must be a dict .* got list"),
])
def test_from_pretrained_refuses_keywords_that_belong_elsewhere_before_loading(monkeypatch, keywords, error, says):
    import selfspec.loading

    monkeypatch.setattr(selfspec.loading, "load_model", lambda *args, **kwargs: pytest.fail("loaded before checking"))
    with pytest.raises(error, match=says):
        SelfSpecModel.from_pretrained("some/model", **keywords)


def test_from_pretrained_still_passes_model_keywords_through(monkeypatch, model):
    import selfspec.loading

    seen = {}
    monkeypatch.setattr(selfspec.loading, "load_model", lambda path, **kwargs: seen.update(kwargs) or model)
    monkeypatch.setattr(selfspec.loading, "load_tokenizer", lambda path: None)
    spec = SelfSpecModel.from_pretrained("some/model", revision="main", drafter_options={"max_ngram_size": 2})
    assert seen["revision"] == "main" and spec.drafter.max_ngram_size == 2


def test_a_tokenizer_must_be_one_and_fit_the_models_vocabulary(model):
    with pytest.raises(ValueError, match="the tokenizer has 300 tokens but the model's vocabulary only 96: it belongs "
                                         "to another model"):
        SelfSpecModel(model, drafter="ngram", tokenizer=tiny_tokenizer())
    with pytest.raises(TypeError, match=r"tokenizer='gpt2' is a name, not a tokenizer: load it first, "
                                        r"tokenizer=AutoTokenizer.from_pretrained\('gpt2'\)"):
        SelfSpecModel(model, drafter="ngram", tokenizer="gpt2")
    with pytest.raises(TypeError, match="tokenizer must be a tokenizer .* got int"):
        SelfSpecModel(model, drafter="ngram", tokenizer=42)
    padded = tiny_model("llama", vocab_size=320)  # a model's vocabulary is often padded past its tokenizer's
    assert SelfSpecModel(padded, drafter="ngram", tokenizer=tiny_tokenizer()).tokenizer is not None


@pytest.mark.parametrize("drafter, options, says", [
    ("ngram", dict(max_ngram_size=2.5), "max_ngram_size must be an integer >= 1, got 2.5"),
    ("ngram", dict(min_ngram_size="1"), "min_ngram_size must be an integer >= 1, got '1'"),
    ("early_exit", dict(exit_layer=1, min_draft_confidence=None), r"min_draft_confidence must be a number in "
     r"\[0, 1\], got None"),
    ("early_exit", dict(exit_layer=1, min_draft_confidence="0.2"), "min_draft_confidence must be .* got '0.2'"),
    ("early_exit", dict(exit_layer=1, share_work="no"), "share_work must be True or False, got 'no'"),
    ("medusa", dict(min_draft_confidence="0.2"), "min_draft_confidence must be a number .* got '0.2'"),
    ("eagle", dict(min_draft_confidence=None), "min_draft_confidence must be a number .* got None"),
])
def test_drafter_options_of_the_wrong_type(model, drafter, options, says):
    heads = {"medusa": MedusaHeads.for_model, "eagle": EagleHead.for_model}.get(drafter, lambda model: None)(model)
    with pytest.raises(ValueError, match=says):
        SelfSpecModel(model, drafter=drafter, heads=heads, **options)


def test_a_drafter_class_instead_of_an_instance(model):
    with pytest.raises(TypeError, match=r"drafter=NgramDrafter is a class: pass an instance: drafter=NgramDrafter\(\)"):
        SelfSpecModel(model, drafter=NgramDrafter)


# -- generate's arguments: refused at the call (stream too, before its first step; a batch too) ------------

DEFAULT = object()  # start()'s own prompts (None is a prompt to refuse)


def start(spec, call: str, prompt=DEFAULT, **options):
    """Start decoding as `call` does: "generate", "stream" (called, never iterated: it must fail at the call), or
    "batch" (generate on a list of two prompts, `prompt` the second)."""
    if call == "batch":
        second = random_prompt(7, seed=1)[0] if prompt is DEFAULT else prompt
        return spec.generate([random_prompt(5)[0], second], max_new_tokens=4, **options)
    return getattr(spec, call)(random_prompt(5) if prompt is DEFAULT else prompt, max_new_tokens=4, **options)


CALLS = ["generate", "stream", "batch"]


@pytest.mark.parametrize("eos_token_id, says", [
    ("12", r"eos_token_id='12' is a token's text: pass tokenizer.eos_token_id \(an id\), not the token text"),
    (2.5, r"eos_token_id must be a token id \(an int\) or a list of them, got 2.5"),
    ([1, None], r"must be a token id .* got None in \[1, None\]"),
    (True, "must be a token id .* got True"),
    (torch.tensor(1.0), "must be a token id"),
    (-5, r"eos_token_id -5 is outside the model's vocabulary \[0, 96\)"),
    ([1, 96], r"eos_token_id 96 is outside the model's vocabulary \[0, 96\)"),
])
@pytest.mark.parametrize("call", CALLS)
def test_eos_token_id_must_be_ids_of_the_vocabulary(spec, eos_token_id, says, call):
    with pytest.raises(ValueError, match=says):
        start(spec, call, eos_token_id=eos_token_id)


def test_eos_token_id_takes_python_numpy_and_torch_integers(spec):
    prompt = random_prompt(6)
    free = spec.generate(prompt, max_new_tokens=12, eos_token_id=[]).sequences[0, 6:]
    eos = int(free[5])
    expected = spec.generate(prompt, max_new_tokens=12, eos_token_id=eos).sequences
    assert expected.shape[1] < 6 + 12
    for form in (np.int64(eos), torch.tensor(eos), torch.tensor([eos]), (eos,), [np.int32(eos)]):
        assert torch.equal(spec.generate(prompt, max_new_tokens=12, eos_token_id=form).sequences, expected), form


ENCODING = transformers.BatchEncoding({"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3)})


@pytest.mark.parametrize("prompt, error, says", [
    (None, TypeError, "the prompt is None: pass text, token ids, or chat messages"),
    (ENCODING, TypeError, r"the prompt is a tokenizer's output .* use generate\(\*\*encoding\)"),
    ({"role": "user", "content": "hi"}, TypeError, r"one chat message .* wrap the message in a list: "
     r"generate\(\[message\]\)"),
    (torch.tensor([[5.0, 6.0, 7.0]]), TypeError, "token ids must be integers, got torch.float32 ids"),
    (np.array([5.9, 6.9, 7.9]), TypeError, "token ids must be integers, got torch.float64 ids"),
    ([5.7, 9.2, 11.9], TypeError, "token ids must be integers"),
    (torch.tensor([True, False, True]), TypeError, "token ids must be integers, got torch.bool ids"),
])
@pytest.mark.parametrize("call", CALLS)
def test_what_is_not_a_prompt(spec, prompt, error, says, call):
    with pytest.raises(error, match=says) as refused:
        start(spec, call, prompt)
    assert call != "batch" or str(refused.value).startswith("prompt 1 (of 2): ")  # a batch names the prompt


@pytest.mark.parametrize("options, says", [
    (dict(seed="42"), r"seed must be an integer in \[-2\*\*63, 2\*\*64 - 1\] \(torch's seeds\), got '42'"),
    (dict(seed=4.5), "seed must be an integer .* got 4.5"),
    (dict(seed=True), "seed must be an integer .* got True"),
    (dict(seed=2**64), "seed must be an integer .* got 18446744073709551616"),
    (dict(generator=42), r"generator must be a torch.Generator \(for several prompts, a list of one per prompt\), "
     "got 42"),
    (dict(generator=[torch.Generator(), 3]), "generator must be a torch.Generator"),
])
@pytest.mark.parametrize("call", CALLS)
def test_seed_and_generator_are_checked_at_the_call(spec, options, says, call):
    with pytest.raises(ValueError, match=says):
        start(spec, call, do_sample=True, **options)


def test_a_list_of_generators_is_for_several_prompts(spec):
    with pytest.raises(ValueError, match=r"a list \(1 generators\) gives one to each of several prompts; for one "
                                         "prompt pass one torch.Generator"):
        spec.stream(random_prompt(5), do_sample=True, generator=[torch.Generator()])
    prompt = random_prompt(5)
    seeded = spec.generate(prompt, max_new_tokens=6, do_sample=True, seed=3).sequences
    assert torch.equal(spec.generate(prompt, max_new_tokens=6, do_sample=True, seed=np.int64(3)).sequences, seeded)


# -- a user's drafter: its drafts are checked before they are verified -------------------------------------

class Proposing:
    """A user's drafter that proposes what `make(context)` returns."""

    def __init__(self, make):
        self.make = make

    def propose(self, context):
        return self.make(context)

    def observe(self, num_drafted, num_accepted):
        pass


def point_at(token: int, num_tokens: int = 1) -> torch.Tensor:
    """[num_tokens, VOCAB] draft_probs with all their mass on `token`."""
    return torch.zeros(num_tokens, VOCAB, dtype=torch.float64).index_fill_(1, torch.tensor([token]), 1.0)


@pytest.mark.parametrize("make, says", [
    (lambda context: None, "Proposing.propose returned NoneType, not a Draft: return Draft"),
    (lambda context: torch.tensor([5, 6]), "Proposing.propose returned Tensor, not a Draft"),
    (lambda context: Draft([5, 6]), "Proposing drafted a list: Draft.tokens must be a 1-D tensor of token ids"),
    (lambda context: Draft(torch.tensor([5.0, 6.0])), r"Proposing drafted a torch.float32 tensor of shape \(2,\)"),
    (lambda context: Draft(torch.tensor([[5, 6]])), r"Proposing drafted a torch.int64 tensor of shape \(1, 2\)"),
    (lambda context: Draft(torch.arange(3, 4 + context.num_draft_tokens)), r"Proposing drafted 3 tokens but was "
     r"asked for at most 2 \(DraftContext.num_draft_tokens\)"),
    (lambda context: Draft(torch.tensor([5, 96])), r"Proposing drafted ids outside the model's vocabulary "
     r"\[0, 96\): \[5, 96\]"),
    (lambda context: Draft(torch.tensor([-1])), r"ids outside the model's vocabulary \[0, 96\): \[-1\]"),
    (lambda context: Draft(torch.tensor([5, 6]), torch.full((2, 10), 0.1)), r"Proposing gave draft_probs of a "
     r"torch.float32 tensor of shape \(2, 10\) for 2 tokens: Draft.probs must be \[2, 96\] floats"),
    (lambda context: Draft(torch.tensor([5]), point_at(7)), "Proposing drafted a token its draft_probs give "
     "probability 0"),
])
@pytest.mark.parametrize("call", ["generate", "batch"])
def test_a_drafters_bad_draft_is_refused_naming_the_drafter(model, make, says, call):
    spec = SelfSpecModel(model, drafter=Proposing(make))
    with pytest.raises(ValueError, match=says):
        start(spec, call, num_draft_tokens=2)


def test_a_draft_within_its_bounds_passes(model):
    """Draft probabilities with mass at the drafted token, a tree of tree_size nodes: accepted as before."""
    spec = SelfSpecModel(model, drafter=Proposing(lambda context: Draft(torch.tensor([5]), point_at(5))))
    spec.generate(random_prompt(5), max_new_tokens=4, num_draft_tokens=1, do_sample=True, seed=0)
    tree = Proposing(lambda context: Draft(torch.tensor([3, 4]), parents=torch.tensor([-1, -1])))
    SelfSpecModel(model, drafter=tree, tree_size=2).generate(random_prompt(5), max_new_tokens=4, num_draft_tokens=1)


def test_a_tree_of_more_nodes_than_tree_size_is_refused(model):
    tree = Proposing(lambda context: Draft(torch.tensor([3, 4, 5]), parents=torch.tensor([-1, -1, -1])))
    with pytest.raises(ValueError, match=r"drafted 3 tokens but was asked for at most 2 \(DraftContext.tree_size\)"):
        SelfSpecModel(model, drafter=tree, tree_size=2).generate(random_prompt(5), max_new_tokens=4, num_draft_tokens=1)
