"""EagleHead: built from the base's own layer class for each supported family, checkpoints round-trip exactly (with
and without the base at hand), heads of another base or an unsupported family are refused clearly."""
import pytest
import torch

from heads.eagle import EagleHead
from tests.conftest import tiny_model

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]


def probe(head, model, length=5):
    torch.manual_seed(0)
    hidden = model.config.hidden_size
    features = torch.randn(1, length, hidden, dtype=torch.float64)
    embeddings = model.get_input_embeddings()(torch.arange(3, 3 + length)[None])
    return head(features, embeddings, torch.arange(length)[None])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_head_of_the_base_layer_class_runs_for_every_family(family):
    model = tiny_model(family)
    head = EagleHead.for_model(model)
    layer_class = type(model.get_decoder().layers[0])
    assert isinstance(head.layers[0], layer_class)
    assert head.fuse.weight.dtype == torch.float64 and head.draft_vocab is None
    out = probe(head, model)
    assert out.shape == (1, 5, model.config.hidden_size) and torch.isfinite(out).all()


def test_causal_over_positions_and_the_cache_reproduces_one_pass():
    """Feeding positions one by one through the head's cache equals one causal pass over all of them."""
    model = tiny_model()
    head = EagleHead.for_model(model)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    torch.manual_seed(1)
    features = torch.randn(1, 6, model.config.hidden_size, dtype=torch.float64)
    embeddings = model.get_input_embeddings()(torch.arange(3, 9)[None])
    whole = head(features, embeddings, torch.arange(6)[None])
    cache = head.new_cache()
    first = head(features[:, :3], embeddings[:, :3], torch.arange(3)[None], cache)
    rest = [head(features[:, i : i + 1], embeddings[:, i : i + 1], torch.tensor([[i]]), cache) for i in range(3, 6)]
    torch.testing.assert_close(torch.cat([first, *rest], 1), whole)
    changed = features.clone()
    changed[:, 5] += 1.0  # a later position must not change earlier outputs
    torch.testing.assert_close(head(changed, embeddings, torch.arange(6)[None])[:, :5], whole[:, :5])


def test_save_load_round_trip_is_exact_with_and_without_the_model(tmp_path):
    model = tiny_model()
    draft_vocab = torch.tensor([5, 9, 3, 40])
    head = EagleHead.for_model(model, draft_vocab=draft_vocab)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    head.save_pretrained(tmp_path)
    for loaded in (EagleHead.from_pretrained(tmp_path, model=model), EagleHead.from_pretrained(tmp_path)):
        assert torch.equal(loaded.draft_vocab, draft_vocab)
        for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(probe(loaded.double(), model), probe(head.eval(), model), rtol=0, atol=0)


def test_heads_of_another_base_or_family_fail_clearly(tmp_path):
    model = tiny_model()
    EagleHead.for_model(model).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="different base model"):
        EagleHead.from_pretrained(tmp_path, model=tiny_model(seed=3))
    with pytest.raises(ValueError, match="hidden size"):
        EagleHead.from_pretrained(tmp_path, model=tiny_model(hidden=48))
    with pytest.raises(NotImplementedError, match="EAGLE heads support Llama-style decoders"):
        EagleHead.for_model(tiny_model("gpt2"))


def test_a_fresh_head_adds_a_few_percent_at_most_for_a_real_shape():
    """SmolLM2's shape (hidden 576, intermediate 1536, 9 heads / 3 KV heads, 49,152 tokens, 30 layers): one layer +
    fusion is about 3 % of the base (the base's embedding and LM head are shared, not copied)."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                                      num_key_value_heads=3, num_hidden_layers=1, vocab_size=1000)
    model = transformers.LlamaForCausalLM(config)
    head = EagleHead.for_model(model)
    base_params = 134_515_008  # SmolLM2-135M-Instruct
    assert 0.02 < head.num_parameters / base_params < 0.05


def test_the_kind_of_a_heads_directory_is_read_from_it_whatever_its_format(tmp_path):
    """`SelfSpecModel(model, heads=DIR)` with no drafter= picks the drafter of the directory's kind: EAGLE for
    selfspec's EAGLE format, a speculators EAGLE-3 draft, SafeAILab's EAGLE-3 and EAGLE-1 heads and vLLM's EAGLE-1
    export; Medusa for selfspec's, published and vLLM's Medusa heads. Medusa's loader refuses every EAGLE one."""
    from safetensors.torch import save_file

    from heads import MedusaHeads
    from heads.eagle import is_eagle_directory
    from selfspec import SelfSpecModel
    from tests.conftest import random_prompt
    from tests.heads import published_eagle as published
    from tests.heads import test_eagle_speculators as spec

    model = tiny_model(num_layers=8)
    EagleHead.for_model(model).save_pretrained(tmp_path / "selfspec-eagle")
    spec.write(tmp_path / "speculators", spec.speculators_config(), spec.speculators_weights(model))
    safeailab = {k.replace("layers.0.", "midlayer."): v for k, v in spec.speculators_weights(model).items()}
    published.write_published(tmp_path / "safeailab-eagle3", safeailab, spec.safeailab_config())
    config = published.published_config(model)
    published.write_published(tmp_path / "eagle1", published.random_published_weights(model, config), config)
    EagleHead.for_model(model, layout="eagle1").save_pretrained(tmp_path / "vllm-eagle1", format="vllm")
    MedusaHeads.for_model(model, num_heads=2).save_pretrained(tmp_path / "selfspec-medusa")
    MedusaHeads.for_model(model, num_heads=2).save_pretrained(tmp_path / "vllm-medusa", format="vllm", model=model)
    (tmp_path / "medusa").mkdir()
    (tmp_path / "medusa" / "config.json").write_text('{"medusa_num_heads": 1, "medusa_num_layers": 1}')
    save_file({"0.0.linear.weight": torch.zeros(32, 32), "0.0.linear.bias": torch.zeros(32)},
              str(tmp_path / "medusa" / "medusa_lm_head.safetensors"))
    eagle = ("selfspec-eagle", "speculators", "safeailab-eagle3", "eagle1", "vllm-eagle1")
    for name in eagle + ("selfspec-medusa", "vllm-medusa", "medusa"):
        assert is_eagle_directory(tmp_path / name) == (name in eagle), name
        drafter = SelfSpecModel(model, heads=str(tmp_path / name)).drafter
        assert type(drafter).__name__ == ("EagleDrafter" if name in eagle else "MedusaDrafter"), name
        if name in eagle:
            with pytest.raises(ValueError, match="holds an EAGLE head, not Medusa heads"):
                MedusaHeads.from_pretrained(tmp_path / name, model=model)
    spec_model = SelfSpecModel(model, heads=str(tmp_path / "speculators"))
    assert spec_model.target.feature_layers == spec.AUX  # the draft's auxiliary layers, handed over by the target
    prompt = random_prompt(6)
    plain = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(spec_model.generate(prompt, max_new_tokens=8).sequences, plain)
