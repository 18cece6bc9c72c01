"""EAGLE-3 drafts in the speculators format (`heads/eagle_speculators.py`): a draft written by hand with the format's
key names computes what a naive reference of the format's math computes, an "eagle3" head exports with the names and
config keys speculators and vLLM read and loads back exactly, and a draft for another base is refused saying what
differs."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from heads.eagle import EagleHead
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model

AUX = (1, 2)  # of a 4-layer tiny base
DRAFT_IDS = torch.tensor([3, 4, 7, 10, 20, 33, 50, 95])  # ascending, as the format orders draft ids
LAYER = dict(model_type="llama", hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512, vocab_size=96)


def speculators_config(aux=AUX, draft_vocab_size=len(DRAFT_IDS), architectures=("LlamaForCausalLM",), **flags):
    """A config.json as the speculators package writes an EAGLE-3 draft (its transformers-4 style layer keys)."""
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
        "transformer_layer_config": dict(LAYER), "draft_vocab_size": draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(aux), "norm_before_residual": False, "norm_before_fc": False,
        "fc_norm": False, "norm_output": False, "target_hidden_size": None,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "tiny-llama", "architectures": list(architectures)},
        },
        **flags,
    }


def speculators_weights(model, seed=0) -> dict[str, torch.Tensor]:
    """Random weights under the format's names: fc over the aux layers, layer 0 with 2H-wide q/k/v and a hidden_norm,
    norm, the draft's own lm_head, d2t / t2d and the verifier's embedding."""
    g = torch.Generator().manual_seed(seed)
    H, I, n = 32, LAYER["intermediate_size"], len(AUX)

    def rand(*shape, scale=0.2):
        return (scale * torch.randn(*shape, generator=g)).double()

    prefix = "layers.0."
    weights = {
        "fc.weight": rand(H, n * H), "norm.weight": 1 + rand(H), "lm_head.weight": rand(len(DRAFT_IDS), H, scale=1.0),
        f"{prefix}hidden_norm.weight": 1 + rand(H), f"{prefix}input_layernorm.weight": 1 + rand(H),
        f"{prefix}post_attention_layernorm.weight": 1 + rand(H),
        f"{prefix}self_attn.q_proj.weight": rand(32, 2 * H), f"{prefix}self_attn.k_proj.weight": rand(16, 2 * H),
        f"{prefix}self_attn.v_proj.weight": rand(16, 2 * H), f"{prefix}self_attn.o_proj.weight": rand(H, 32),
        f"{prefix}mlp.gate_proj.weight": rand(I, H), f"{prefix}mlp.up_proj.weight": rand(I, H),
        f"{prefix}mlp.down_proj.weight": rand(H, I),
        "d2t": DRAFT_IDS - torch.arange(len(DRAFT_IDS)),
        "t2d": torch.zeros(96, dtype=torch.bool).index_fill_(0, DRAFT_IDS, True),
        "embed_tokens.weight": model.get_input_embeddings().weight.detach().clone(),
    }
    return weights


def write(directory, config, weights):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"))


# ---- a naive reference of the format's math, written from its description (no transformers modules) ----

def rms_norm(x, weight, eps):
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, positions, theta):
    """x [heads, T, d] with rotary embeddings at `positions` (the halves rotated, as Llama does)."""
    d = x.shape[-1]
    angles = positions[:, None].double() / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


def reference_eagle3(w, hidden, embeddings, norm_before_residual=False):
    """hidden [T, H] (fc's output for real positions, the previous output for drafted ones), embeddings [T, H] ->
    ([T, H] pre-norm outputs, [T, 96] logits over the whole vocabulary, -inf outside the draft vocabulary); every
    row attends causally to the rows before it, at positions 0..T-1."""
    eps, heads, kv_heads, d = LAYER["rms_norm_eps"], 4, 2, 8
    p = "layers.0."
    normed = rms_norm(hidden, w[p + "hidden_norm.weight"], eps)
    x = torch.cat([rms_norm(embeddings, w[p + "input_layernorm.weight"], eps), normed], -1)  # embedding FIRST
    T = x.shape[0]
    positions = torch.arange(T)
    q = rotate((x @ w[p + "self_attn.q_proj.weight"].T).view(T, heads, d).transpose(0, 1), positions, 10000.0)
    k = rotate((x @ w[p + "self_attn.k_proj.weight"].T).view(T, kv_heads, d).transpose(0, 1), positions, 10000.0)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(T, kv_heads, d).transpose(0, 1)
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(d) + torch.full((T, T), -math.inf).triu(1)
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, heads * d) @ w[p + "self_attn.o_proj.weight"].T
    out = (normed if norm_before_residual else hidden) + attended
    mlp_in = rms_norm(out, w[p + "post_attention_layernorm.weight"], eps)
    gate, up = mlp_in @ w[p + "mlp.gate_proj.weight"].T, mlp_in @ w[p + "mlp.up_proj.weight"].T
    out = out + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    draft_logits = rms_norm(out, w["norm.weight"], eps) @ w["lm_head.weight"].T
    targets = torch.arange(len(w["d2t"])) + w["d2t"]  # target id = draft id + d2t[draft id]
    return out, torch.full((T, 96), -math.inf, dtype=out.dtype).index_copy(1, targets, draft_logits)


def base_rows(model, length=9, seed=0):
    """(tokens [T], [T, 3H] the rows the target hands an EAGLE-3 head: final state, hidden_states 1 and 2)."""
    tokens = random_prompt(length, seed=seed)[0]
    target = TargetModel(model)
    target.set_feature_layers(AUX)
    with torch.no_grad():
        return tokens, target.forward(tokens, target.new_cache())


def full_logits(head, target, states):
    """[T, H] head states -> [T, vocab] its draft logits placed at their token ids, -inf elsewhere."""
    logits = head.draft_logits(states, target, head.draft_vocab)
    return torch.full((states.shape[0], target.vocab_size), -math.inf, dtype=logits.dtype).index_copy(
        1, head.draft_vocab, logits)


@pytest.mark.parametrize("norm_before_residual", [False, True])
@pytest.mark.parametrize("midlayer", [False, True], ids=["layers.0", "midlayer"])
def test_a_hand_written_speculators_draft_computes_the_formats_math(tmp_path, norm_before_residual, midlayer):
    """Against the naive reference: one pass over real positions, then a drafted step through the head's cache that
    reads the previous output back (pre-norm, no fc). Planted bugs it caught: the concatenation in [hidden; embedding]
    order, the residual taken after hidden_norm when the flag is off, and the state fed back being norm(out) instead of
    out."""
    model = tiny_model(num_layers=4)
    weights = speculators_weights(model)
    on_disk = {k.replace("layers.0.", "midlayer."): v for k, v in weights.items()} if midlayer else weights
    write(tmp_path, speculators_config(norm_before_residual=norm_before_residual), on_disk)
    head = EagleHead.from_pretrained(tmp_path, model=model)
    assert head.config.layout == "eagle3" and head.config.feature_layers == AUX
    assert head.layer_config.intermediate_size == 48  # the layer follows the draft's own config, not the base's (64)
    assert torch.equal(head.draft_vocab, DRAFT_IDS)
    tokens, rows = base_rows(model)
    target = TargetModel(model)
    embed = model.get_input_embeddings()
    real = rows[:-1]  # position t reads the embedding of token t + 1
    with torch.no_grad():
        embeddings = embed(tokens[1:])
        fc = rows[:-1, 32:] @ weights["fc.weight"].T  # the aux layers only, not the final state
        expected, expected_logits = reference_eagle3(weights, fc, embeddings, norm_before_residual)
        cache = head.new_cache()
        got = head(real[None], embeddings[None], torch.arange(len(real))[None], cache)[0]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(full_logits(head, target, got), expected_logits, rtol=1e-5, atol=1e-5)
        # a drafted step: its hidden is the last output as it is, its token the draft's
        drafted = torch.tensor([int(DRAFT_IDS[expected_logits[-1, DRAFT_IDS].argmax()])])
        step = head(got[None, -1:], embed(drafted)[None], torch.tensor([[len(real)]]), cache)[0]
        chained, chained_logits = reference_eagle3(weights, torch.cat([fc, expected[-1:]]),
                                                   torch.cat([embeddings, embed(drafted)]), norm_before_residual)
    torch.testing.assert_close(step, chained[-1:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full_logits(head, target, step), chained_logits[-1:], rtol=1e-5, atol=1e-5)


def perturbed_eagle3(model, draft_vocab=None, seed=0):
    head = EagleHead.for_model(model, layout="eagle3", feature_layers=AUX, draft_vocab=draft_vocab)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return head.eval()


@pytest.mark.parametrize("draft_vocab", [None, torch.tensor([50, 3, 20, 7, 95, 4])], ids=["full", "draft-vocab"])
def test_export_has_the_formats_names_and_keys_and_loads_back_exactly(tmp_path, draft_vocab):
    """Planted bugs it caught: `feature_fc.weight` exported under our name instead of `fc.weight`; d2t written as the
    target ids themselves instead of offsets; the config without norm_before_residual (vLLM reads it as true)."""
    model = tiny_model(num_layers=4)
    head = perturbed_eagle3(model, draft_vocab)
    head.save_pretrained(tmp_path, format="speculators", model=model)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["eagle_aux_hidden_state_layer_ids"] == list(AUX) and config["norm_before_residual"] is False
    assert config["draft_vocab_size"] == (96 if draft_vocab is None else 6)
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] >= 1
    layer = config["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["hidden_size"], layer["vocab_size"]) == (
        "llama", 1, 32, 96)
    assert layer["rope_theta"] == model.config.rope_parameters["rope_theta"]
    state = load_file(tmp_path / "model.safetensors")
    names = {"fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "layers.0.hidden_norm.weight",
             "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight"}
    names |= {f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"}
    names |= {f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert set(state) == names | (set() if draft_vocab is None else {"d2t", "t2d"})
    assert state["fc.weight"].shape == (32, 64) and state["layers.0.self_attn.q_proj.weight"].shape == (32, 64)
    if draft_vocab is not None:
        ids = torch.tensor([3, 4, 7, 20, 50, 95])  # ascending
        assert torch.equal(torch.arange(6) + state["d2t"], ids) and state["d2t"].dtype == torch.int64
        assert state["t2d"].dtype == torch.bool and torch.equal(state["t2d"].nonzero()[:, 0], ids)
        # lm_head row i is draft id i's: the head's row of that token
        rows = {int(t): r for t, r in zip(head.draft_vocab, head.lm_head.weight.detach())}
        assert all(torch.equal(state["lm_head.weight"][i], rows[int(t)]) for i, t in enumerate(ids))
    loaded = EagleHead.from_pretrained(tmp_path, model=model)
    tokens, rows = base_rows(model)
    target = TargetModel(model)
    embeddings = model.get_input_embeddings()(tokens[1:]).detach()
    with torch.no_grad():
        before = head(rows[None, :-1], embeddings[None], torch.arange(8)[None])[0]
        after = loaded(rows[None, :-1], embeddings[None], torch.arange(8)[None])[0]
        torch.testing.assert_close(after, before, rtol=0, atol=0)
        if draft_vocab is None:
            torch.testing.assert_close(loaded.draft_logits(after, target), head.draft_logits(before, target),
                                       rtol=0, atol=0)
        else:
            torch.testing.assert_close(full_logits(loaded, target, after), full_logits(head, target, before),
                                       rtol=0, atol=0)
    other = tiny_model(num_layers=4, seed=3)  # same shapes, another training
    with pytest.raises(ValueError, match="stores an embedding that differs"):
        EagleHead.from_pretrained(tmp_path, model=other)
    head.save_pretrained(tmp_path / "bare", format="speculators")  # no embedding: the carried signature checks
    assert "embed_tokens.weight" not in load_file(tmp_path / "bare" / "model.safetensors")
    with pytest.raises(ValueError, match="different base model"):
        EagleHead.from_pretrained(tmp_path / "bare", model=other)


def test_a_draft_for_another_base_is_refused_saying_what_differs(tmp_path):
    model = tiny_model(num_layers=4)
    weights = speculators_weights(model)
    write(tmp_path / "ok", speculators_config(), weights)
    with pytest.raises(ValueError, match=r"hidden size 32, this model 48.*--eagle-layout eagle3"):
        EagleHead.from_pretrained(tmp_path / "ok", model=tiny_model(num_layers=4, hidden=48))
    with pytest.raises(ValueError, match="a vocabulary of 96 tokens, this model 128"):
        EagleHead.from_pretrained(tmp_path / "ok", model=tiny_model(num_layers=4, vocab_size=128))
    with pytest.raises(ValueError, match=r"auxiliary layers \[1, 2\], of which \[2\] lie beyond"):
        EagleHead.from_pretrained(tmp_path / "ok", model=tiny_model(num_layers=2))
    write(tmp_path / "qwen", speculators_config(architectures=("Qwen2ForCausalLM",)), weights)
    with pytest.raises(ValueError, match=r"a Qwen2ForCausalLM verifier, this model a LlamaForCausalLM.*check_base"):
        EagleHead.from_pretrained(tmp_path / "qwen", model=model)
    assert EagleHead.from_pretrained(tmp_path / "qwen", model=model, check_base=False).config.layout == "eagle3"
    with pytest.raises(ValueError, match="stores an embedding that differs"):  # same shapes, another training
        EagleHead.from_pretrained(tmp_path / "ok", model=tiny_model(num_layers=4, seed=3))


def test_what_selfspec_does_not_compute_is_refused_naming_it(tmp_path):
    model = tiny_model(num_layers=4)
    weights = speculators_weights(model)
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        write(tmp_path / flag, speculators_config(**{flag: True}), weights)
        with pytest.raises(NotImplementedError, match=flag):
            EagleHead.from_pretrained(tmp_path / flag, model=model)
    write(tmp_path / "wide", speculators_config(target_hidden_size=64), weights)
    with pytest.raises(NotImplementedError, match="target_hidden_size"):
        EagleHead.from_pretrained(tmp_path / "wide", model=model)
    write(tmp_path / "mtp", {**speculators_config(), "speculators_model_type": "mtp"}, weights)
    with pytest.raises(NotImplementedError, match="speculators 'mtp' draft"):
        EagleHead.from_pretrained(tmp_path / "mtp", model=model)
    write(tmp_path / "no-map", speculators_config(), {k: v for k, v in weights.items() if k not in ("d2t", "t2d")})
    with pytest.raises(ValueError, match="needs the d2t map"):
        EagleHead.from_pretrained(tmp_path / "no-map", model=model)
    with pytest.raises(ValueError, match="format='speculators' holds EAGLE-3 drafts"):
        EagleHead.for_model(model, feature_layers=AUX).save_pretrained(tmp_path / "a", format="speculators")
    with pytest.raises(ValueError, match="format='speculators'"):  # and the EAGLE-1 export points there
        perturbed_eagle3(model).save_pretrained(tmp_path / "b", format="vllm")
    with pytest.raises(NotImplementedError, match="Llama-style"):
        EagleHead.for_model(tiny_model("phi3", num_layers=4), layout="eagle3", feature_layers=AUX)
    with pytest.raises(ValueError, match="give feature_layers"):
        EagleHead.for_model(model, layout="eagle3")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
