"""Published Medusa heads (read) and vLLM's Medusa layout (write, read back), on directories built here."""
import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from heads import MedusaHeads
from tests.conftest import random_prompt, tiny_model

HIDDEN, VOCAB = 32, 96


def published_state(num_heads, num_layers, own_lm_head, seed=0, prefix=""):
    """A state dict as FasterDecoding/Medusa saves it: {i}.{j}.linear.* blocks, then {i}.{num_layers}.weight."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(num_heads):
        for j in range(num_layers):
            state[f"{prefix}{i}.{j}.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) * 0.1
            state[f"{prefix}{i}.{j}.linear.bias"] = torch.randn(HIDDEN, generator=g, dtype=torch.float64) * 0.1
        if own_lm_head:
            state[f"{prefix}{i}.{num_layers}.weight"] = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64)
    return state


def write_published(directory, state, config, extension):
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if extension == "safetensors":
        save_file(state, str(directory / "medusa_lm_head.safetensors"))
    else:
        torch.save(state, directory / "medusa_lm_head.pt")
    return directory


def expected_logits(state, hidden, num_heads, num_layers, lm_head_weight=None):
    """Medusa's own definition, written out: x <- x + SiLU(W x + b) per block, then the head's (or base's) LM head."""
    out = []
    for i in range(num_heads):
        x = hidden
        for j in range(num_layers):
            x = x + torch.nn.functional.silu(x @ state[f"{i}.{j}.linear.weight"].T + state[f"{i}.{j}.linear.bias"])
        weight = lm_head_weight if lm_head_weight is not None else state[f"{i}.{num_layers}.weight"]
        out.append(x @ weight.T)
    return torch.stack(out, dim=-2)


def hidden_of(model):
    return model.model(input_ids=random_prompt()).last_hidden_state[0]  # [T, hidden]


@pytest.mark.parametrize("extension", ["safetensors", "pt"])
def test_published_v1_heads_with_their_own_lm_heads_load_exactly(tmp_path, extension):
    model = tiny_model()
    state = published_state(num_heads=3, num_layers=2, own_lm_head=True)
    # Uploaded configs under-report the heads (servers take the number from a flag): trust the tensors.
    config = {"medusa_num_heads": 2, "medusa_num_layers": 2, "base_model_name_or_path": "someone/tiny"}
    heads = MedusaHeads.from_pretrained(write_published(tmp_path / "h", state, config, extension), model=model)
    assert (heads.num_heads, heads.config.num_layers, heads.config.share_lm_head) == (3, 2, False)
    assert heads.config.base.name_or_path == "someone/tiny"
    assert torch.equal(heads.blocks[2][1].linear.bias, state["2.1.linear.bias"])
    assert torch.equal(heads.lm_heads[1].weight, state["1.2.weight"])
    hidden = hidden_of(model)
    torch.testing.assert_close(heads(hidden, model.lm_head), expected_logits(state, hidden, 3, 2))


@pytest.mark.parametrize("extension", ["safetensors", "pt"])
def test_published_v2_heads_reuse_the_base_lm_head(tmp_path, extension):
    model = tiny_model()
    state = published_state(num_heads=4, num_layers=1, own_lm_head=False, prefix="medusa_head.")
    config = {"medusa_num_heads": 4, "medusa_num_layers": 1, "version": "2", "base_model_name_or_path": "x"}
    heads = MedusaHeads.from_pretrained(write_published(tmp_path / "h", state, config, extension), model=model)
    assert (heads.num_heads, heads.config.share_lm_head, heads.config.base.vocab_size) == (4, True, VOCAB)
    hidden = hidden_of(model)
    plain = {k.removeprefix("medusa_head."): v for k, v in state.items()}
    torch.testing.assert_close(
        heads(hidden, model.lm_head), expected_logits(plain, hidden, 4, 1, model.lm_head.weight)
    )


def test_published_shared_heads_without_a_model_need_a_vocab_size(tmp_path):
    state = published_state(num_heads=2, num_layers=1, own_lm_head=False)
    directory = write_published(tmp_path / "h", state, {"medusa_num_layers": 1, "version": "2"}, "safetensors")
    with pytest.raises(ValueError, match="pass the base|model=model"):
        MedusaHeads.from_pretrained(directory)
    (directory / "config.json").write_text(json.dumps({"medusa_num_layers": 1, "vocab_size": VOCAB}))
    assert MedusaHeads.from_pretrained(directory).config.base.vocab_size == VOCAB


def test_published_heads_of_another_hidden_size_fail_clearly(tmp_path):
    state = published_state(num_heads=2, num_layers=1, own_lm_head=True)
    directory = write_published(tmp_path / "h", state, {"medusa_num_layers": 1}, "safetensors")
    with pytest.raises(ValueError, match="hidden size 32 but the model has 48"):
        MedusaHeads.from_pretrained(directory, model=tiny_model(hidden=48))


def test_published_heads_with_a_missing_tensor_fail_clearly(tmp_path):
    state = published_state(num_heads=2, num_layers=1, own_lm_head=True)
    del state["1.0.linear.bias"]
    directory = write_published(tmp_path / "h", state, {"medusa_num_layers": 1}, "safetensors")
    with pytest.raises(ValueError, match="no tensor '1.0.linear.bias'"):
        MedusaHeads.from_pretrained(directory)


def trained_like(heads, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return heads


def test_vllm_export_with_a_shared_lm_head_has_exactly_vllms_names_and_shapes(tmp_path):
    model = tiny_model()
    heads = trained_like(MedusaHeads.for_model(model, num_heads=3, num_layers=2))
    with pytest.raises(ValueError, match="pass the base model"):
        heads.save_pretrained(tmp_path / "no-model", format="vllm")
    heads.save_pretrained(tmp_path / "vllm", format="vllm", model=model)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert {k: config[k] for k in (
        "model_type", "architectures", "hidden_size", "vocab_size", "num_heads", "num_hidden_layers",
        "truncated_vocab_size", "medusa_fc_bias", "original_lm_head",
    )} == dict(
        model_type="medusa", architectures=["MedusaModel"], hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=3,
        num_hidden_layers=2, truncated_vocab_size=VOCAB, medusa_fc_bias=True, original_lm_head=True,
    )
    weights = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    expected = {f"blocks.{i}.layers.{j}.{p}": (HIDDEN, HIDDEN) if p == "weight" else (HIDDEN,)
                for i in range(3) for j in range(2) for p in ("weight", "bias")}
    expected["lm_heads.0.weight"] = (VOCAB, HIDDEN)
    assert {k: tuple(v.shape) for k, v in weights.items()} == expected
    assert torch.equal(weights["lm_heads.0.weight"], model.lm_head.weight)
    assert torch.equal(weights["blocks.2.layers.1.bias"], heads.blocks[2][1].linear.bias)
    # and it reads back as the same heads
    loaded = MedusaHeads.from_pretrained(tmp_path / "vllm", model=model)
    hidden = hidden_of(model)
    assert torch.equal(loaded(hidden, model.lm_head), heads(hidden, model.lm_head))


def test_vllm_export_with_own_lm_heads_writes_one_per_head(tmp_path):
    model = tiny_model()
    heads = trained_like(MedusaHeads.for_model(model, num_heads=2, num_layers=1, share_lm_head=False))
    heads.save_pretrained(tmp_path, format="vllm")  # no base needed: every projection is in the heads
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["original_lm_head"] is False and config["num_heads"] == 2
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(weights) == [
        "blocks.0.layers.0.bias", "blocks.0.layers.0.weight", "blocks.1.layers.0.bias", "blocks.1.layers.0.weight",
        "lm_heads.0.weight", "lm_heads.1.weight",
    ]
    assert torch.equal(weights["lm_heads.1.weight"], heads.lm_heads[1].weight)
    loaded = MedusaHeads.from_pretrained(tmp_path, model=model)
    hidden = hidden_of(model)
    assert torch.equal(loaded(hidden, model.lm_head), heads(hidden, model.lm_head))


def vllm_medusa_logits(weights, config, hidden, lm_head_weight=None):
    """vLLM's MedusaModel, written out from its source (vllm/model_executor/models/medusa.py): per head,
    x <- x + SiLU(layer(x)) with layer an nn.Linear (weight [out, in]: x @ W.T + b), then the head's LM head (one
    shared LM head, `lm_heads.0`, when original_lm_head), then logits * logit_scale (its LogitsProcessor)."""
    out = []
    for i in range(config["num_heads"]):
        x = hidden
        for j in range(config["num_hidden_layers"]):
            x = x + torch.nn.functional.silu(x @ weights[f"blocks.{i}.layers.{j}.weight"].T + weights[f"blocks.{i}.layers.{j}.bias"])
        lm_head = weights["lm_heads.0.weight" if config["original_lm_head"] else f"lm_heads.{i}.weight"]
        out.append(x @ lm_head.T * config.get("logit_scale", 1.0))
    return torch.stack(out, dim=-2)


def asymmetric(heads, seed=0):
    """Heads whose square block weights are far from symmetric, so a transposed export cannot pass for the original."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blocks in heads.blocks:
            for block in blocks:
                block.linear.weight.copy_(torch.randn(block.linear.weight.shape, generator=g, dtype=torch.float64).triu() * 0.3)
                block.linear.bias.copy_(torch.randn(block.linear.bias.shape, generator=g, dtype=torch.float64) * 0.3)
    return heads


@pytest.mark.parametrize("share_lm_head", [True, False])
def test_vllm_export_computes_what_vllm_computes(tmp_path, share_lm_head):
    """The exported file, read as vLLM reads it, gives our heads' logits: the square H x H block weights keep nn.Linear's
    [out, in] orientation (a transposed copy has the same shape and the same names; only the logits tell).
    Catches (planted): block weights exported transposed (`block.linear.weight.T`)."""
    model = tiny_model()
    heads = asymmetric(MedusaHeads.for_model(model, num_heads=2, num_layers=2, share_lm_head=share_lm_head))
    heads.save_pretrained(tmp_path, format="vllm", model=model)
    config = json.loads((tmp_path / "config.json").read_text())
    weights = load_file(str(tmp_path / "model.safetensors"))
    hidden = hidden_of(model)
    torch.testing.assert_close(vllm_medusa_logits(weights, config, hidden), heads(hidden, model.lm_head), rtol=0, atol=1e-10)


def test_vllm_export_carries_the_base_logit_scale(tmp_path):
    """A base that scales its logits (Cohere's logit_scale): vLLM's Medusa reads the scale from the heads' own config,
    so the export writes it, and vLLM's logits then equal what selfspec drafts with (the base's logits transform).
    A base without one writes none. Catches (planted): the logit_scale branch removed from `save_vllm`."""
    from selfspec import SelfSpecModel

    config = transformers.CohereConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, logit_scale=0.25,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    target = SelfSpecModel(model, drafter="none").target  # checks at wrap time that it reproduces Cohere's logits
    heads = asymmetric(MedusaHeads.for_model(model, num_heads=2))
    heads.save_pretrained(tmp_path / "cohere", format="vllm", model=model)
    exported = json.loads((tmp_path / "cohere" / "config.json").read_text())
    assert exported["logit_scale"] == 0.25
    weights = load_file(str(tmp_path / "cohere" / "model.safetensors"))
    hidden = model.model(input_ids=random_prompt()).last_hidden_state[0]
    torch.testing.assert_close(vllm_medusa_logits(weights, exported, hidden), heads(hidden, target.logits), rtol=0, atol=1e-10)
    plain = tiny_model()
    MedusaHeads.for_model(plain, num_heads=2).save_pretrained(tmp_path / "plain", format="vllm", model=plain)
    assert "logit_scale" not in json.loads((tmp_path / "plain" / "config.json").read_text())


def test_vllm_export_of_heads_with_a_draft_vocabulary_writes_vllms_token_map(tmp_path):
    """Heads drafting among N tokens export vLLM's `token_map` (their draft vocabulary, in its order) with
    `truncated_vocab_size` N and the base LM head's N rows; read as vLLM's Medusa reads it (the one LM head's rows,
    logits -inf outside the map) it scores what selfspec drafts from, and it reads back with the same draft
    vocabulary. Own LM heads, which vLLM builds over the whole vocabulary and cannot combine with a token map, are
    refused. Catches (planted): the export without the token map (vLLM then drafts over the whole vocabulary)."""
    model = tiny_model()
    draft_vocab = torch.tensor([40, 3, 95, 17, 60, 8, 21, 77])  # most frequent first, not sorted
    heads = asymmetric(MedusaHeads.for_model(model, num_heads=2, num_layers=2, draft_vocab=draft_vocab))
    heads.save_pretrained(tmp_path / "vllm", format="vllm", model=model)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert (config["vocab_size"], config["truncated_vocab_size"], config["original_lm_head"]) == (VOCAB, 8, True)
    weights = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert torch.equal(weights["token_map"], draft_vocab) and weights["token_map"].dtype == torch.int64
    assert torch.equal(weights["lm_heads.0.weight"], model.lm_head.weight[draft_vocab])
    hidden = hidden_of(model)
    token_map = weights["token_map"]
    draft = vllm_medusa_logits(weights, config, hidden)  # [T, heads, N]: the one LM head holds the map's rows
    theirs = torch.full((*draft.shape[:-1], VOCAB), -torch.inf, dtype=draft.dtype)
    theirs[..., token_map] = draft  # vLLM's compute_logits with a token map
    ours = heads(hidden, lambda x: x @ model.lm_head.weight[heads.draft_vocab].T)  # [T, heads, N], as drafted
    torch.testing.assert_close(theirs[..., heads.draft_vocab], ours, rtol=0, atol=1e-10)
    assert torch.isinf(theirs).sum() == theirs[..., 0].numel() * (VOCAB - 8)
    loaded = MedusaHeads.from_pretrained(tmp_path / "vllm", model=model)
    assert torch.equal(loaded.draft_vocab, draft_vocab) and loaded.config.draft_vocab_size == 8
    assert torch.equal(loaded(hidden, model.lm_head), heads(hidden, model.lm_head))
    own = MedusaHeads.for_model(model, num_heads=2, share_lm_head=False, draft_vocab=draft_vocab)
    with pytest.raises(ValueError, match="draft among 8 tokens with their own LM heads.*--draft-vocab-size 0"):
        own.save_pretrained(tmp_path / "own", format="vllm", model=model)
    assert not (tmp_path / "own").exists()


def test_vllm_export_refuses_another_base(tmp_path):
    heads = MedusaHeads.for_model(tiny_model())
    with pytest.raises(ValueError, match="different base model"):
        heads.save_pretrained(tmp_path, format="vllm", model=tiny_model(seed=1))


def test_unknown_format_name():
    with pytest.raises(ValueError, match="unknown heads format"):
        MedusaHeads.for_model(tiny_model()).save_pretrained("/nonexistent", format="medusa")
