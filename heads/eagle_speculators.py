"""EAGLE heads in the `speculators` package's format, which vLLM serves for EAGLE-3 drafts: the "eagle3" layout of
`heads/eagle_module.py` written (`save_speculators`) and read (`load_speculators`), and SafeAILab/EAGLE's own EAGLE-3
directories read (`load_safeailab`). Knows file layouts, key names and config keys only.

What the format holds, as read in `speculators` 0.9.0 (`speculators/models/eagle3/config.py`, `core.py`,
`model_definitions.py`, `speculators/model.py`, `speculators/train/vocab_mapping.py`) and in vLLM
(`vllm/model_executor/models/llama_eagle3.py`, `vllm/transformers_utils/configs/speculators/`):
- config.json: `speculators_model_type: "eagle3"`, `architectures: ["Eagle3Speculator"]`,
  `transformer_layer_config` (the draft layers' own config: a Llama or Qwen3 config with `num_hidden_layers` = the
  draft's layers and `vocab_size` = the verifier's), `draft_vocab_size`, `eagle_aux_hidden_state_layer_ids` (the
  verifier's layers fc reads: the input of decoder layer l, `hidden_states[l]` in transformers' terms, as vLLM
  captures them and concatenates them: in ascending order), `norm_before_residual`, `norm_before_fc`, `fc_norm`,
  `norm_output`, `target_hidden_size`, `speculators_config` {algorithm, proposal_methods [{proposal_type "greedy",
  speculative_tokens, ...}], default_proposal_method, verifier {name_or_path, architectures}}. vLLM requires
  `speculators_config.verifier.name_or_path` (`vllm serve DIR` loads the verifier by it) and
  `proposal_methods[0].speculative_tokens`, and reads a missing `norm_before_residual` as true (the package's default
  is false), so it is always written. vLLM's Llama and Qwen3 EAGLE-3 models build fc over exactly 3 auxiliary layers
  ([H, 3 H]: `num_aux_hidden_states` defaults to 3), so a draft of another count does not load there.
- weights (model.safetensors): `fc.weight` [H, n H] over the auxiliary layers only (no final state, no bias),
  `layers.0.*` (vLLM also takes SafeAILab's `midlayer.*`) with `self_attn.{q,k,v}_proj.weight` [.., 2 H] reading
  cat(input_layernorm(embed), hidden_norm(hidden)), `layers.0.hidden_norm.weight`, `norm.weight`, `lm_head.weight`
  [draft_vocab_size, H] (the draft's own), `embed_tokens.weight` (optional: vLLM shares the verifier's without it),
  and, when the draft vocabulary is smaller than the verifier's, `d2t` (int64 [draft_vocab_size] offsets: target id =
  draft id + d2t[draft id]) and `t2d` (bool [vocab_size], true at the draft vocabulary's ids). Draft ids are the
  target ids in ascending order. `verifier_norm` / `verifier_lm_head` are training-only and never saved. With
  `norm_before_fc`, `input_norm.weight` [n H] (optional: speculators and vLLM then keep its initial ones); with
  `fc_norm`, `fc_norm.{i}.weight` [H] per auxiliary layer.
- the computation: fc reads the auxiliary states (through `input_norm` with `norm_before_fc`, through `fc_norm.i` per
  slot with `fc_norm`; the two exclude each other); layer 0 takes residual = hidden (hidden_norm(hidden) with
  `norm_before_residual`), attends over the 2 H concatenation, adds the residual, then post-attention norm and MLP;
  logits are lm_head(norm(out)), and out (pre-norm) is the next draft step's hidden, or norm(out) with `norm_output`
  (EAGLE 3.1: speculators' training makes `norm_before_fc` and `norm_output` its defaults). A `target_hidden_size`
  other than the draft's is refused here.

SafeAILab/EAGLE's EAGLE-3 heads (`eagle/model/cnets.py`; the directories its authors publish) hold the same tensors,
layer 0 named `midlayer.*` (the speculators converter, `speculators/convert/eagle/eagle3_converter.py`, maps it to
`layers.0.*` and changes no other name), in `pytorch_model.bin` or `model.safetensors`, beside a Llama config.json of
the draft's layer that adds `draft_vocab_size` (architectures `LlamaForCausalLMEagle3`). It names no auxiliary layers:
they are the verifier's 2, L // 2, L - 3 (SafeAILab's base model collects the inputs of those decoder layers, in that
order) unless an `eagle_config` says `eagle_aux_hidden_state_layer_ids`; its residual is the un-normed hidden
(`norm_before_residual` false, as the converter's default); the verifier's vocabulary is `t2d`'s length.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch
from safetensors.torch import load_file, save_file

from heads.checkpoint import CONFIG_NAME, WEIGHTS_NAME, BaseIdentity, attach, load_state_in_its_dtype
from heads.eagle_formats import BASE_KEY, add_legacy_rope_keys, embedding_differs, size_differences
from heads.eagle_module import EAGLE3_FLAGS, EagleConfig, default_feature_layers

MODEL_TYPE = "eagle3"
ARCHITECTURE = "Eagle3Speculator"  # the speculators config's default; vLLM maps the layer model type to its own class
FORMAT_VERSION = "0.9.0"  # the speculators release whose format this module follows
LAYER_TYPES = ("llama", "qwen3")  # the layer families speculators and vLLM build EAGLE-3 drafts of
VLLM_FEATURE_LAYERS = 3  # the auxiliary layers vLLM's Llama / Qwen3 EAGLE-3 fc reads ([H, 3 H])
SPECULATIVE_TOKENS = 3  # the chain length the config proposes (vLLM's default num_speculative_tokens for it)
INDEX_NAME = "model.safetensors.index.json"
SAFEAILAB_KEYS = ("architectures", "draft_vocab_size", "eagle_config", "base_model_name_or_path", *EAGLE3_FLAGS,
                  "eagle_aux_hidden_state_layer_ids")  # a SafeAILab config.json's keys that describe no layer
TRAIN_ONE = ("train one for this model with `python -m training.heads --kind eagle --eagle-layout eagle3 "
             "--feature-layers auto`")


def is_speculators_config(raw: dict) -> bool:
    """Whether a config.json was written in the `speculators` format (it names its `speculators_model_type`)."""
    return "speculators_model_type" in raw


def save_speculators(head, directory, model=None, verifier_name_or_path: str | None = None) -> None:
    """Write an "eagle3" `head` in the speculators format (config.json + model.safetensors). With the base `model`
    its embedding is written too (`embed_tokens.weight`) and the verifier's architecture is recorded. The verifier's
    name (what `vllm serve DIR` loads) is `verifier_name_or_path`, else the name of the base the head records, else
    `model`'s; with none of them the export is refused."""
    config = head.config
    if config.layout != "eagle3":
        raise ValueError(
            f"format='speculators' holds EAGLE-3 drafts ('eagle3' layout); this head has the {config.layout!r} layout, "
            "whose layer reads a fusion of [feature; embedding] and the base's LM head, which that format has no place "
            f"for. To serve a head with vLLM's eagle3 method, {TRAIN_ONE}; an 'eagle1' head exports as format='vllm'"
        )
    layer_type = head.layer_config.model_type
    if layer_type not in LAYER_TYPES:
        raise ValueError(f"the speculators format and vLLM build EAGLE-3 drafts of {' and '.join(LAYER_TYPES)} layers; "
                         f"this head's layers are {layer_type!r}")
    if len(config.feature_layers) != VLLM_FEATURE_LAYERS:
        raise ValueError(
            f"this head reads {len(config.feature_layers)} feature layers {list(config.feature_layers)}, and vLLM's "
            f"EAGLE-3 models build fc over exactly {VLLM_FEATURE_LAYERS} ([H, {VLLM_FEATURE_LAYERS} H]): the export "
            f"would not load there. Train one with {VLLM_FEATURE_LAYERS} feature layers: `--feature-layers auto` on a "
            "base of 7 layers or more, or three indices (e.g. `--feature-layers 2 15 27`)"
        )
    if model is not None:
        head.check_base(model, "the EAGLE head being exported")
    verifier_name = verifier_name_or_path or config.base.name_or_path or (
        BaseIdentity.of(model).name_or_path if model is not None else "")
    if not verifier_name:
        raise ValueError(
            "the speculators format names its verifier (`speculators_config.verifier.name_or_path`), which `vllm serve "
            "DIR` loads, and this head's base has no name (a model built in code, or the head was saved without one): "
            "pass the base's hub id, save_pretrained(dir, format='speculators', verifier_name_or_path='org/model')"
        )
    dtype = head.feature_fc.weight.dtype
    state = {"fc.weight": head.feature_fc.weight, "norm.weight": head.norm.weight}
    state.update({f"layers.{k}": v for k, v in head.layers.state_dict().items()})
    if config.norm_before_fc:
        state["input_norm.weight"] = head.input_norm.weight
    if config.fc_norm:
        state.update({f"fc_norm.{k}": v for k, v in head.fc_norm.state_dict().items()})
    vocab_size, lm_head = config.base.vocab_size, head.lm_head.weight
    if head.draft_vocab is not None:
        ids, order = head.draft_vocab.sort()  # draft id i is the i-th smallest target id
        lm_head = lm_head[order]
        state["d2t"] = ids - torch.arange(len(ids), device=ids.device)
        state["t2d"] = torch.zeros(vocab_size, dtype=torch.bool).index_fill_(0, ids.cpu(), True)
    state["lm_head.weight"] = lm_head
    if model is not None:
        state["embed_tokens.weight"] = model.get_input_embeddings().weight
    # clone: a tied embedding shares storage with the LM head, and safetensors refuses shared tensors
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous().clone()
             for k, v in state.items()}
    # the draft's layers hold plain weights, whatever the base was loaded from (vLLM refuses a GGUF base's
    # quantization_config on the draft)
    layer = {k: v for k, v in head.layer_config.to_dict().items()
             if not k.startswith("_") and k not in ("architectures", "quantization_config")}
    dtype_name = str(dtype).removeprefix("torch.")
    layer.update(num_hidden_layers=config.num_layers, hidden_size=config.base.hidden_size, vocab_size=vocab_size,
                 model_type=layer_type, torch_dtype=dtype_name, dtype=dtype_name)
    add_legacy_rope_keys(layer)
    verifier_architectures = list(getattr(model.config, "architectures", None) or [type(model).__name__]) if model \
        is not None else []
    written = {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": FORMAT_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": len(head.draft_vocab) if head.draft_vocab is not None else vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(config.feature_layers),  # ascending, as vLLM concatenates them
        **{flag: getattr(config, flag) for flag in EAGLE3_FLAGS},
        "target_hidden_size": None,
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": SPECULATIVE_TOKENS,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": verifier_architectures},
        },
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        BASE_KEY: asdict(config.base),  # selfspec's own: the base identity with its LM-head signature
    }
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_NAME), "w") as f:
        json.dump(written, f, indent=2)
    save_file(state, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt"})


def load_speculators(cls, directory, raw: dict, model=None, check_base: bool = True):
    """A speculators EAGLE-3 draft in `directory` -> an "eagle3" head of class `cls`; with `model`, checked against it
    (hidden size, vocabulary, layers against the auxiliary layer ids, and unless check_base=False the verifier's
    architecture, the stored embedding and selfspec's LM-head signature) and placed on it."""
    kind = raw.get("speculators_model_type")
    if kind != MODEL_TYPE:
        raise NotImplementedError(f"{str(directory)!r} is a speculators {kind!r} draft model; selfspec runs the "
                                  f"speculators format's {MODEL_TYPE!r} drafts only")
    layer = dict(raw.get("transformer_layer_config") or {})
    layer.setdefault("model_type", "qwen3")  # the speculators config's default layer config
    hidden, vocab_size = int(layer.get("hidden_size", 0)), int(layer.get("vocab_size", 0))
    if not hidden or not vocab_size:
        raise ValueError(f"{str(directory)!r}: transformer_layer_config names no hidden_size or vocab_size")
    target_hidden = raw.get("target_hidden_size")
    if target_hidden not in (None, hidden):
        raise NotImplementedError(f"{str(directory)!r}: its layers are {hidden} wide but read a verifier {target_hidden} "
                                  "wide (target_hidden_size); selfspec's heads share the base's width")
    verifier = (raw.get("speculators_config") or {}).get("verifier") or {}
    base = BaseIdentity.from_dict(raw[BASE_KEY]) if BASE_KEY in raw else BaseIdentity(
        hidden, vocab_size, name_or_path=str(verifier.get("name_or_path") or ""))
    flags = {flag: bool(raw.get(flag, False)) for flag in EAGLE3_FLAGS}
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    return _eagle3_head(cls, directory, read_weights(directory), layer, base, aux,
                        int(raw.get("draft_vocab_size") or vocab_size), flags, verifier, model, check_base)


def load_safeailab(cls, directory, raw: dict, state: dict[str, torch.Tensor], model=None, check_base: bool = True):
    """A SafeAILab/EAGLE EAGLE-3 head (its config.json `raw` and tensors `state`, `midlayer.*` for layer 0) -> an
    "eagle3" head of class `cls`, read as the speculators converter would map it; with `model`, checked and placed."""
    if "hidden_size" not in raw or "num_hidden_layers" not in raw:
        raise ValueError(f"{str(directory)!r}: an EAGLE-3 head in SafeAILab's layout whose config.json names no "
                         "hidden_size or num_hidden_layers")
    layer = {k: v for k, v in raw.items() if k not in SAFEAILAB_KEYS and k != BASE_KEY}
    layer.setdefault("model_type", "llama")  # SafeAILab builds Llama layers
    t2d = state.get("t2d")
    layer["vocab_size"] = int(t2d.shape[0]) if t2d is not None else int(raw.get("vocab_size", 0))
    eagle_config = raw.get("eagle_config") or {}  # (vLLM reads these keys there too)
    aux = eagle_config.get("eagle_aux_hidden_state_layer_ids") or raw.get("eagle_aux_hidden_state_layer_ids")
    flags = {flag: bool(eagle_config.get(flag, raw.get(flag, False))) for flag in EAGLE3_FLAGS}
    base = BaseIdentity(int(raw["hidden_size"]), layer["vocab_size"],
                        name_or_path=str(raw.get("base_model_name_or_path") or ""))
    draft_vocab_size = int(raw.get("draft_vocab_size") or layer["vocab_size"])
    return _eagle3_head(cls, directory, state, layer, base, aux, draft_vocab_size, flags, {}, model, check_base)


def _eagle3_head(cls, directory, state: dict[str, torch.Tensor], layer: dict, base: BaseIdentity, aux,
                 draft_vocab_size: int, flags: dict, verifier: dict, model, check_base: bool):
    """The "eagle3" head the format's tensors `state` (speculators' or SafeAILab's names), the layer's config, the
    auxiliary layer ids `aux` (None: the verifier's default) and flags describe; checked against `model` and placed on
    it when given. Its feature layers are kept ascending, fc's column blocks moved with them."""
    vocab_size = int(layer["vocab_size"])
    if model is not None:
        check_verifier(verifier, base, aux, model, directory, check_base)
    if aux is None:  # speculators then takes the verifier's 2, L // 2, L - 3
        if model is None:
            raise ValueError(f"{str(directory)!r} names no eagle_aux_hidden_state_layer_ids; its default depends on "
                             "the verifier: load it with the base, EagleHead.from_pretrained(dir, model=model)")
        aux = default_feature_layers(model.config.get_text_config(decoder=True).num_hidden_layers)
    draft_vocab = draft_ids(state, draft_vocab_size, vocab_size, directory)
    if model is not None and check_base and "embed_tokens.weight" in state:
        check_embedding(state["embed_tokens.weight"], model, directory)
    config = EagleConfig(base, layer, int(layer.get("num_hidden_layers", 1)),
                         0 if draft_vocab is None else len(draft_vocab), layout="eagle3", feature_layers=tuple(aux),
                         **flags)
    head = cls(config)  # layers of the class its config names
    ours = our_state(state, head.state_dict(), directory)
    if draft_vocab is not None:
        ours["draft_vocab"] = draft_vocab
    load_state_in_its_dtype(head, ours)
    head.sort_feature_slots(tuple(int(l) for l in aux))  # fc's blocks follow the ids' order as written
    if model is not None:
        head = attach(head, model, base, f"the EAGLE head in {str(directory)!r}", check_identity=check_base)
    return head.eval()


def check_verifier(verifier: dict, base: BaseIdentity, aux, model, directory, check_base: bool) -> None:
    """Raise a ValueError naming every way `model` differs from the verifier the draft was made for (`verifier`: the
    config's {name_or_path, architectures}, or {}), and what to do."""
    text_config = model.config.get_text_config(decoder=True)
    differences = size_differences(base, model)
    num_layers = text_config.num_hidden_layers
    beyond = [l for l in aux or () if not 0 <= l < num_layers]
    if beyond:
        differences.append(f"auxiliary layers {list(aux)}, of which {beyond} lie beyond this model's {num_layers} "
                           f"decoder layers (hidden_states 0..{num_layers - 1})")
    theirs = set(verifier.get("architectures") or ())
    mine = set(getattr(model.config, "architectures", None) or ()) | {type(model).__name__}
    if check_base and theirs and not theirs & mine:
        differences.append(f"a {'/'.join(sorted(theirs))} verifier, this model a {type(model).__name__}")
    if differences:
        named = f" ({verifier['name_or_path']})" if verifier.get("name_or_path") else ""
        raise ValueError(
            f"the EAGLE-3 draft in {str(directory)!r} was made for another base{named}: {'; '.join(differences)}. Load "
            f"it with the verifier it names, or {TRAIN_ONE}" + (" (pass check_base=False to skip the architecture "
                                                                "check)" if any("verifier" in d for d in differences) else "")
        )


def check_embedding(embedding: torch.Tensor, model, directory) -> None:
    """A draft that stores an embedding other than `model`'s was trained for another base of the same shape."""
    if embedding_differs(embedding, model):
        raise ValueError(f"the EAGLE-3 draft in {str(directory)!r} stores an embedding that differs from this model's: "
                         f"it was trained for another base of the same shape. Load it with that base, or {TRAIN_ONE}. "
                         "To force it anyway pass check_base=False")


def read_weights(directory) -> dict[str, torch.Tensor]:
    """model.safetensors, or the shards a model.safetensors.index.json lists."""
    single, index = os.path.join(directory, WEIGHTS_NAME), os.path.join(directory, INDEX_NAME)
    if os.path.isfile(single):
        return load_file(single)
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(os.path.join(directory, shard)).items()}
    raise FileNotFoundError(f"{str(directory)!r} holds a speculators config.json but no {WEIGHTS_NAME} (nor "
                            f"{INDEX_NAME}): copy the whole directory")


def draft_ids(state: dict[str, torch.Tensor], draft_vocab_size: int, vocab_size: int, directory) -> torch.Tensor | None:
    """[N] target ids of draft ids 0..N-1 from `d2t` (checked against `t2d` when present), or None: the whole
    vocabulary in its own order (no `d2t`, as the format writes when the vocabularies are equal)."""
    d2t, t2d = state.get("d2t"), state.get("t2d")
    if d2t is None:
        if draft_vocab_size != vocab_size:
            raise ValueError(f"{str(directory)!r}: a draft vocabulary of {draft_vocab_size} of {vocab_size} tokens "
                             "needs the d2t map, which the weights lack")
        return None
    if d2t.shape != (draft_vocab_size,):
        raise ValueError(f"{str(directory)!r}: d2t has shape {tuple(d2t.shape)}, draft_vocab_size is {draft_vocab_size}")
    ids = torch.arange(draft_vocab_size) + d2t.long()
    if bool(((ids < 0) | (ids >= vocab_size)).any()) or ids.unique().numel() != draft_vocab_size:
        raise ValueError(f"{str(directory)!r}: d2t maps draft ids outside the vocabulary of {vocab_size} tokens or two "
                         "of them onto one token")
    if t2d is not None:
        mask = t2d.bool()
        if mask.shape != (vocab_size,) or int(mask.sum()) != draft_vocab_size or not bool(mask[ids].all()):
            raise ValueError(f"{str(directory)!r}: t2d does not mark the {draft_vocab_size} tokens d2t maps to")
    return ids


def our_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], directory) -> dict[str, torch.Tensor]:
    """The format's tensor names -> the "eagle3" head's, checked against its own state dict (names and shapes)."""
    ours = {}
    for key, value in state.items():
        if key in ("d2t", "t2d", "embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight") or \
                key.endswith("rotary_emb.inv_freq") or (key == "input_norm.weight" and key not in expected):
            # vocabulary maps read above; the base's embedding is used at call time; training-only tensors; an
            # input norm its config does not switch on (vLLM drops it too)
            continue
        name = "layers.0." + key.removeprefix("midlayer.") if key.startswith("midlayer.") else key
        name = "feature_fc.weight" if name == "fc.weight" else name
        if name not in expected or name == "draft_vocab":
            raise ValueError(f"{str(directory)!r}: unexpected tensor {key!r}; not an EAGLE-3 draft of this config")
        if value.shape != expected[name].shape:
            raise ValueError(f"{str(directory)!r}: {key} has shape {tuple(value.shape)}, its config.json implies "
                             f"{tuple(expected[name].shape)}")
        ours[name] = value
    if "input_norm.weight" in expected and "input_norm.weight" not in ours and "feature_fc.weight" in ours:
        # optional in the format: speculators and vLLM keep its initial ones
        dtype = ours["feature_fc.weight"].dtype
        ours["input_norm.weight"] = torch.ones_like(expected["input_norm.weight"], dtype=dtype)
    missing = sorted(set(expected) - set(ours) - {"draft_vocab"})
    if missing:
        raise ValueError(f"{str(directory)!r}: the weights have no {', '.join(missing)}; the file is incomplete or "
                         "another layout")
    return ours
