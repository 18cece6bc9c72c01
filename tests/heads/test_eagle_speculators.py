"""EAGLE-3 drafts in the speculators format (`heads/eagle_speculators.py`): a draft written by hand with the format's
key names (with EAGLE 3.1's norms, auxiliary ids in any order, or as SafeAILab publishes it) computes what a naive
reference of the format's math computes, an "eagle3" head exports with the names and config keys speculators and vLLM
read and loads back exactly, and what vLLM could not serve (not 3 feature layers, no verifier name) or a draft for
another base is refused saying what differs and what to do."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from heads.eagle import EagleHead
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model

AUX = (1, 2, 3)  # of a 4-layer tiny base: three, as vLLM's EAGLE-3 reads
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
EAGLE3_1 = {"norm_before_fc": True, "norm_output": True}  # speculators' training defaults (EAGLE 3.1)
VERIFIER = "org/tiny-llama"  # the verifier name exports of the nameless tiny base are given
DRAFT_IDS = torch.tensor([3, 4, 7, 10, 20, 33, 50, 95])  # ascending, as the format orders draft ids
LAYER = dict(model_type="llama", hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512, vocab_size=96)


def speculators_config(aux=AUX, draft_vocab_size=len(DRAFT_IDS), architectures=("LlamaForCausalLM",), **flags):
    """(flags: the format's norm flags, and any key to override)"""
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


def speculators_weights(model, seed=0, **flags) -> dict[str, torch.Tensor]:
    """Random weights under the format's names: fc over the aux layers, layer 0 with 2H-wide q/k/v and a hidden_norm,
    norm, the draft's own lm_head, d2t / t2d and the verifier's embedding; `input_norm` [n H] with norm_before_fc and
    `fc_norm.i` with fc_norm."""
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
    if flags.get("norm_before_fc"):
        weights["input_norm.weight"] = 1 + rand(n * H, scale=0.5)
    if flags.get("fc_norm"):
        weights.update({f"fc_norm.{i}.weight": 1 + rand(H, scale=0.5) for i in range(n)})
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


def reference_fc(w, aux, norm_before_fc=False, fc_norm=False, **_):
    """aux [T, n H] the auxiliary states in the order the config lists them -> [T, H] fc's output (through one norm
    over all of them, or one norm per slot, as the flags say)."""
    eps, H = LAYER["rms_norm_eps"], LAYER["hidden_size"]
    if norm_before_fc:
        aux = rms_norm(aux, w["input_norm.weight"], eps)
    if fc_norm:
        aux = torch.cat([rms_norm(s, w[f"fc_norm.{i}.weight"], eps) for i, s in enumerate(aux.split(H, -1))], -1)
    return aux @ w["fc.weight"].T


def reference_eagle3(w, hidden, embeddings, norm_before_residual=False, norm_output=False, **_):
    """hidden [T, H] (fc's output for real positions, the previous output for drafted ones), embeddings [T, H] ->
    ([T, H] outputs: pre-norm, post-norm with norm_output; [T, 96] logits over the whole vocabulary, -inf outside the
    draft vocabulary); every row attends causally to the rows before it, at positions 0..T-1."""
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
    normed_out = rms_norm(out, w["norm.weight"], eps)
    draft_logits = normed_out @ w["lm_head.weight"].T
    targets = torch.arange(len(w["d2t"])) + w["d2t"]  # target id = draft id + d2t[draft id]
    logits = torch.full((T, 96), -math.inf, dtype=out.dtype).index_copy(1, targets, draft_logits)
    return normed_out if norm_output else out, logits


def base_rows(model, length=9, seed=0, layers=AUX):
    """(tokens [T], [T, 4H] the rows the target hands an EAGLE-3 head: final state, hidden_states 1, 2 and 3, or
    those of `layers`)."""
    tokens = random_prompt(length, seed=seed)[0]
    target = TargetModel(model)
    target.set_feature_layers(layers)
    with torch.no_grad():
        return tokens, target.forward(tokens, target.new_cache())


def full_logits(head, target, states):
    """[T, H] head states -> [T, vocab] its draft logits placed at their token ids, -inf elsewhere."""
    logits = head.draft_logits(states, target, head.draft_vocab)
    return torch.full((states.shape[0], target.vocab_size), -math.inf, dtype=logits.dtype).index_copy(
        1, head.draft_vocab, logits)


VARIANTS = {"eagle3": {}, "norm-before-residual": {"norm_before_residual": True}, "eagle3.1": EAGLE3_1,
            "eagle3.1-norm-before-residual": {**EAGLE3_1, "norm_before_residual": True}, "fc-norm": {"fc_norm": True}}


def check_against_reference(head, weights, model, flags, aux=AUX):
    """One pass over real positions, then a drafted step through the head's cache that reads the previous output back
    (pre-norm, or post-norm with norm_output; no fc), both against the reference on the weights as written (`aux`: the
    order the config lists the auxiliary ids in, which fc's column blocks follow)."""
    tokens, rows = base_rows(model, layers=tuple(sorted(aux)))
    target = TargetModel(model)
    embed = model.get_input_embeddings()
    real = rows[:-1]  # position t reads the embedding of token t + 1
    slot = {l: rows[:-1, 32 * (1 + i): 32 * (2 + i)] for i, l in enumerate(sorted(aux))}  # handed over ascending
    with torch.no_grad():
        embeddings = embed(tokens[1:])
        fc = reference_fc(weights, torch.cat([slot[l] for l in aux], -1), **flags)  # not the final state
        expected, expected_logits = reference_eagle3(weights, fc, embeddings, **flags)
        cache = head.new_cache()
        got = head(real[None], embeddings[None], torch.arange(len(real))[None], cache)[0]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(full_logits(head, target, got), expected_logits, rtol=1e-5, atol=1e-5)
        # a drafted step: its hidden is the last output as the head returned it, its token the draft's
        drafted = torch.tensor([int(DRAFT_IDS[expected_logits[-1, DRAFT_IDS].argmax()])])
        step = head(got[None, -1:], embed(drafted)[None], torch.tensor([[len(real)]]), cache)[0]
        chained, chained_logits = reference_eagle3(weights, torch.cat([fc, expected[-1:]]),
                                                   torch.cat([embeddings, embed(drafted)]), **flags)
    torch.testing.assert_close(step, chained[-1:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full_logits(head, target, step), chained_logits[-1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flags", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("midlayer", [False, True], ids=["layers.0", "midlayer"])
def test_a_hand_written_speculators_draft_computes_the_formats_math(tmp_path, flags, midlayer):
    """Against the naive reference, for every norm flag of the format (EAGLE 3.1: a norm over fc's input and post-norm
    states fed back). Planted bugs it caught: the concatenation in [hidden; embedding] order, the residual taken after
    hidden_norm when the flag is off, the state fed back being norm(out) instead of out (and out instead of norm(out)
    with norm_output), logits of norm(norm(out)) with norm_output, per-slot norms applied to the wrong slots."""
    model = tiny_model(num_layers=4)
    weights = speculators_weights(model, **flags)
    on_disk = {k.replace("layers.0.", "midlayer."): v for k, v in weights.items()} if midlayer else weights
    write(tmp_path, speculators_config(**flags), on_disk)
    head = EagleHead.from_pretrained(tmp_path, model=model)
    assert head.config.layout == "eagle3" and head.config.feature_layers == AUX
    assert {f: getattr(head.config, f) for f in FLAGS} == {f: flags.get(f, False) for f in FLAGS}
    assert head.layer_config.intermediate_size == 48  # the layer follows the draft's own config, not the base's (64)
    assert torch.equal(head.draft_vocab, DRAFT_IDS)
    check_against_reference(head, weights, model, flags)


@pytest.mark.parametrize("flags", [{}, EAGLE3_1, {"fc_norm": True}], ids=["eagle3", "eagle3.1", "fc-norm"])
def test_auxiliary_ids_in_another_order_are_kept_ascending_with_fcs_columns(tmp_path, flags):
    """vLLM hands the draft its auxiliary states in ascending layer order: a draft whose config lists them as 3 1 2
    (fc's column blocks, the input norm's and per-slot norms' weights in that order) loads as one reading 1 2 3 that
    computes what the file says."""
    model = tiny_model(num_layers=4)
    weights = speculators_weights(model, **flags)
    write(tmp_path, speculators_config(aux=(3, 1, 2), **flags), weights)
    head = EagleHead.from_pretrained(tmp_path, model=model)
    assert head.config.feature_layers == (1, 2, 3)
    check_against_reference(head, weights, model, flags, aux=(3, 1, 2))
    head.save_pretrained(tmp_path / "out", format="speculators", model=model, verifier_name_or_path=VERIFIER)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    loaded = EagleHead.from_pretrained(tmp_path / "out", model=model)
    check_against_reference(loaded, weights, model, flags, aux=(3, 1, 2))


def test_an_eagle3_1_draft_exports_its_flags_and_norms_and_loads_back_exactly(tmp_path):
    model = tiny_model(num_layers=4)
    for flags in (EAGLE3_1, {"fc_norm": True, "norm_output": True}):
        weights = speculators_weights(model, **flags)
        write(tmp_path / "theirs", speculators_config(**flags), weights)
        head = EagleHead.from_pretrained(tmp_path / "theirs", model=model)
        head.save_pretrained(tmp_path / "ours", format="speculators", model=model, verifier_name_or_path=VERIFIER)
        config = json.loads((tmp_path / "ours" / "config.json").read_text())
        assert {f: config[f] for f in FLAGS} == {f: flags.get(f, False) for f in FLAGS}
        state = load_file(tmp_path / "ours" / "model.safetensors")
        for name in ("input_norm.weight", "fc_norm.0.weight", "fc_norm.2.weight"):
            assert (name in state) == (name in weights) and (name not in state or torch.equal(state[name],
                                                                                               weights[name]))
        head.save_pretrained(tmp_path / "native")
        for directory in ("ours", "native"):
            check_against_reference(EagleHead.from_pretrained(tmp_path / directory, model=model), weights, model, flags)
    # input_norm.weight is optional in the format (speculators and vLLM then keep its initial ones)
    weights = speculators_weights(model, **EAGLE3_1)
    write(tmp_path / "no-input-norm", speculators_config(**EAGLE3_1),
          {k: v for k, v in weights.items() if k != "input_norm.weight"})
    head = EagleHead.from_pretrained(tmp_path / "no-input-norm", model=model)
    assert torch.equal(head.input_norm.weight, torch.ones(96, dtype=torch.float64))


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
    head.save_pretrained(tmp_path, format="speculators", model=model, verifier_name_or_path=VERIFIER)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["eagle_aux_hidden_state_layer_ids"] == list(AUX) and config["norm_before_residual"] is False
    assert config["draft_vocab_size"] == (96 if draft_vocab is None else 6)
    assert config["speculators_config"]["verifier"] == {"name_or_path": VERIFIER, "architectures": ["LlamaForCausalLM"]}
    assert {f: config[f] for f in FLAGS} == dict.fromkeys(FLAGS, False)
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
    assert state["fc.weight"].shape == (32, 96) and state["layers.0.self_attn.q_proj.weight"].shape == (32, 64)
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
    # no embedding: the carried signature checks
    head.save_pretrained(tmp_path / "bare", format="speculators", verifier_name_or_path=VERIFIER)
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
    with pytest.raises(ValueError, match=r"auxiliary layers \[1, 2, 3\], of which \[2, 3\] lie beyond"):
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
    write(tmp_path / "both", speculators_config(norm_before_fc=True, fc_norm=True), weights)
    with pytest.raises(ValueError, match="norm_before_fc .* and fc_norm .* exclude each other"):
        EagleHead.from_pretrained(tmp_path / "both", model=model)
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


def test_an_export_vllm_could_not_serve_is_refused_saying_what_to_do(tmp_path):
    """vLLM's EAGLE-3 fc reads exactly 3 auxiliary layers, and `vllm serve DIR` loads the verifier by the name the
    config gives: an export of 2 layers, or of a base without a name and none given, is refused, writing nothing."""
    model = tiny_model(num_layers=4)
    two = EagleHead.for_model(model, layout="eagle3", feature_layers="auto")  # a 4-layer base: hidden_states 1, 2
    assert two.config.feature_layers == (1, 2)
    with pytest.raises(ValueError, match=r"reads 2 feature layers \[1, 2\].*exactly 3.*--feature-layers auto` on a "
                                         r"base of 7 layers or more"):
        two.save_pretrained(tmp_path / "two", format="speculators", model=model, verifier_name_or_path=VERIFIER)
    head = perturbed_eagle3(model)
    with pytest.raises(ValueError, match=r"base has no name.*verifier_name_or_path='org/model'"):
        head.save_pretrained(tmp_path / "nameless", format="speculators", model=model)
    with pytest.raises(ValueError, match="format='speculators' only"):
        head.save_pretrained(tmp_path / "native", verifier_name_or_path=VERIFIER)
    assert not any(tmp_path.iterdir())
    # a base with a name: the name the head records is written, unless another is given
    model.config._name_or_path = "org/named-base"
    named = perturbed_eagle3(model)
    named.save_pretrained(tmp_path / "named", format="speculators")
    assert json.loads((tmp_path / "named" / "config.json").read_text())["speculators_config"]["verifier"][
        "name_or_path"] == "org/named-base"
    named.save_pretrained(tmp_path / "given", format="speculators", verifier_name_or_path="org/served-base")
    assert json.loads((tmp_path / "given" / "config.json").read_text())["speculators_config"]["verifier"][
        "name_or_path"] == "org/served-base"
    seven = tiny_model(num_layers=7)  # `--feature-layers auto` gives three layers from 7 on
    assert EagleHead.for_model(seven, layout="eagle3", feature_layers="auto").config.feature_layers == (2, 3, 4)


def safeailab_config(**extra) -> dict:
    """config.json of a SafeAILab/EAGLE EAGLE-3 head: a Llama config of its one layer (transformers 4 keys), the
    verifier's vocabulary size and the draft's."""
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size")
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
            "torch_dtype": "float16", "tie_word_embeddings": False, "draft_vocab_size": len(DRAFT_IDS),
            **{k: LAYER[k] for k in keys}, **extra}


@pytest.mark.parametrize("file", ["pytorch_model.bin", "model.safetensors"])
def test_a_safeailab_eagle3_head_reads_as_the_converter_maps_it(tmp_path, file):
    """SafeAILab's directory (`midlayer.*`, its Llama config.json, no auxiliary ids: the verifier's 2, L // 2, L - 3)
    computes the format's math; with an `eagle_config` naming the ids, those. It exports to the speculators format."""
    from tests.heads.published_eagle import write_published

    model = tiny_model(num_layers=8)  # hidden_states 2, 4, 5
    weights = {k.replace("layers.0.", "midlayer."): v for k, v in speculators_weights(model).items()
               if k != "embed_tokens.weight"}  # (SafeAILab's files leave the embedding to the verifier)
    write_published(tmp_path / "default", weights, safeailab_config(), file=file)
    head = EagleHead.from_pretrained(tmp_path / "default", model=model)
    assert head.config.layout == "eagle3" and head.config.feature_layers == (2, 4, 5)
    assert not any(getattr(head.config, f) for f in FLAGS) and torch.equal(head.draft_vocab, DRAFT_IDS)
    plain = {k.replace("midlayer.", "layers.0."): v for k, v in weights.items()}
    check_against_reference(head, plain, model, {}, aux=(2, 4, 5))
    named = safeailab_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [6, 1, 3]})
    write_published(tmp_path / "named", weights, named, file=file)
    check_against_reference(EagleHead.from_pretrained(tmp_path / "named", model=model), plain, model, {}, aux=(6, 1, 3))
    head.save_pretrained(tmp_path / "out", format="speculators", model=model, verifier_name_or_path=VERIFIER)
    check_against_reference(EagleHead.from_pretrained(tmp_path / "out", model=model), plain, model, {}, aux=(2, 4, 5))
    with pytest.raises(ValueError, match="load it with the base"):  # the default ids depend on the verifier
        EagleHead.from_pretrained(tmp_path / "default")
    with pytest.raises(ValueError, match=r"fc.weight has shape \(32, 96\), its config.json implies \(32, 64\)"):
        EagleHead.from_pretrained(tmp_path / "default", model=tiny_model(num_layers=4))  # the defaults: 1, 2


def test_the_export_of_a_head_for_a_gguf_loaded_base_carries_no_quantization_config(tmp_path):
    """A GGUF-loaded base's config says quantization_config {"quant_method": "gguf"}; the head's layer config comes from
    it, and vLLM refused the draft for it ("Unknown quantization method: gguf"): the draft's weights are plain."""
    model = tiny_model(num_layers=4)
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "model.Q4_1.gguf", "dequantize": False}
    head = perturbed_eagle3(model)
    assert "quantization_config" in head.layer_config.to_dict()  # (what the export has to leave out)
    head.save_pretrained(tmp_path, format="speculators", model=model, verifier_name_or_path=VERIFIER)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in config["transformer_layer_config"]
    assert "quantization_config" not in json.dumps(config)
