"""EAGLE heads in other directory layouts: published EAGLE-1/2 heads (read) and vLLM's EAGLE-1 draft model (write
and read). Both hold the "eagle1" layout of `heads/eagle_module.py`; this module knows file layouts and key names only.

What the published heads compute, as read in SafeAILab/EAGLE (`eagle/model/cnets1.py`, the EAGLE-1/2 head;
`eagle/model/cnets.py` in older commits; `eagle/model/ea_model.py`; `eagle/model/modeling_llama_kv.py`):
- (a) Input feature: the base's FINAL, POST-norm hidden state. `EaModel.forward` passes `outputs[0]` of
  `base_model.model(...)` to the head, and that model's forward applies `self.norm` before returning it: the same
  tensor the base's LM head reads (`orig = base_model.lm_head(outputs[0])`). Training features are the same
  post-norm states. (Only EAGLE-3, `cnets.py` today, reads pre-norm states of three layers: its heads are read by
  `heads/eagle_speculators.py`.)
- (b) Output: `Model.forward` returns the last layer's output with no final norm, and `topK_generate` scores it with
  `head(out_hidden)`, where `head` is the base's `lm_head`: straight to the LM head, not through the base's norm.
- (c) Fusion: `fc(cat(inputs_embeds, hidden_states))`, embedding FIRST, neither normed; `fc` is Linear(2H, H) with
  a bias unless config.json says `"bias": false` (`ea_model.py` reads `con["bias"]`, default True). The embedding
  is the base's (copied into the head as `embed_tokens.weight`, frozen). Layer 0 (`LlamaDecoderLayer(index=0)`) has
  no `input_layernorm`; later layers have one. Checkpoint: `pytorch_model.bin` (or `model.safetensors`) with
  `embed_tokens.weight`, `fc.weight` [H, 2H], `fc.bias`, `layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
  `layers.{i}.mlp.{gate,up,down}_proj.weight`, `layers.{i}.post_attention_layernorm.weight`; config.json is a
  LlamaConfig with `num_hidden_layers: 1` describing the head's own layer (Llama layers only; `qkv_bias` adds
  q/k/v biases).
- (d) vLLM (`vllm/model_executor/models/llama_eagle.py`, `vllm/v1/spec_decode/eagle.py`,
  `vllm/v1/worker/gpu_model_runner.py`, `vllm/transformers_utils/configs/eagle.py`, `vllm/config/speculative.py`):
  for method "eagle" the drafter gets `hidden_states` the target model returns, i.e. after its final norm
  (post-norm; only EAGLE-3 takes auxiliary pre-norm layer outputs). `EagleLlamaForCausalLM` computes
  `fc(cat(embed_tokens(ids), hidden_states))` with `fc` built WITHOUT a bias, runs `LlamaDecoderLayer`s whose layer
  0 has `input_layernorm = Identity`, returns `hidden_states + residual` (no final norm) and scores it with the
  TARGET's `lm_head`. Weight names are the published ones (`fc.weight`, `layers.{i}.*`; vLLM adds `model.` itself);
  `embed_tokens.weight` is optional (without it, or when equal to the target's, the target's embedding is shared);
  an `fc.bias` is skipped or rejected depending on the version. config.json is read with AutoConfig (so `model_type:
  "llama"`), then wrapped in `EAGLEConfig`, which renames `architectures` ["LlamaForCausalLM"] to
  ["EagleLlamaForCausalLM"] (the only Llama-layer EAGLE-1 class). The method is "eagle" when the path contains
  "eagle-" or when `speculative_config={"method": "eagle", ...}` says so.
So selfspec's "eagle1" layout is exactly this math on the post-norm features the engine already passes to drafters.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from heads.checkpoint import CONFIG_NAME, WEIGHTS_NAME, BaseIdentity, attach, load_state_in_its_dtype
from heads.eagle_module import EagleConfig

PUBLISHED_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
VLLM_ARCHITECTURE = "LlamaForCausalLM"  # vLLM's EAGLEConfig makes it EagleLlamaForCausalLM
BASE_KEY = "selfspec_base"  # the base identity (with its LM-head signature) that our exports carry along
TRAIN_ONE = "train one for this model with `python -m training.heads --kind eagle --eagle-layout eagle1`"


def published_weights(directory) -> str | None:
    """The path of a published head's weights file (PUBLISHED_WEIGHTS, first found), or None."""
    found = [os.path.join(directory, name) for name in PUBLISHED_WEIGHTS]
    return next((path for path in found if os.path.isfile(path)), None)


def read_published_weights(path: str) -> dict[str, torch.Tensor]:
    return load_file(path) if path.endswith(".safetensors") else torch.load(path, map_location="cpu", weights_only=True)


def published_weight_names(directory) -> set[str]:
    """The tensor names of a published head's weights file (empty without one), its values left unread: the
    safetensors header, or a torch file memory-mapped (a base model's directory given by mistake stays cheap)."""
    path = published_weights(directory)
    if path is None:
        return set()
    if path.endswith(".safetensors"):
        with safe_open(path, framework="pt") as f:
            return set(f.keys())
    try:
        return set(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
    except RuntimeError:  # a file in torch's legacy (non-zip) format cannot be memory-mapped
        return set(read_published_weights(path))


def is_safeailab_eagle3(raw: dict, weight_names) -> bool:
    """Whether a published head's config.json and tensor names are SafeAILab's EAGLE-3 layout (`midlayer.*`)."""
    return any(name.startswith("midlayer.") for name in weight_names) or \
        any("Eagle3" in name for name in raw.get("architectures") or ())


def load_eagle1(cls, directory, raw_config: dict, model=None, check_base: bool = True):
    """A published EAGLE-1/2 head or a vLLM EAGLE-1 export in `directory` -> an "eagle1" head of class `cls`; with
    `model`, checked against it (hidden size, vocabulary, and the head's stored embedding unless check_base=False)
    and placed on it."""
    weights = published_weights(directory)
    if weights is None or "hidden_size" not in raw_config or "num_hidden_layers" not in raw_config:
        raise ValueError(
            f"{directory!r} holds {raw_config.get('format', 'an unknown format')!r}: not an EAGLE head saved by "
            "selfspec (config.json format 'selfspec-eagle'), a published EAGLE-1/2/3 head, a vLLM EAGLE-1 export "
            f"(a Llama config.json and {' or '.join(PUBLISHED_WEIGHTS)}) or a speculators EAGLE-3 draft"
        )
    state = read_published_weights(weights)
    if is_safeailab_eagle3(raw_config, state):
        raise ValueError(f"{directory!r} is an EAGLE-3 head in SafeAILab's layout, not EAGLE-1/2: load it with "
                         "EagleHead.from_pretrained, which reads it as one")
    if raw_config.get("qkv_bias"):
        raise NotImplementedError(
            f"{directory!r}: its layer has q/k/v biases without an output bias, which transformers' Llama layer cannot "
            "express"
        )
    if BASE_KEY in raw_config:
        base = BaseIdentity.from_dict(raw_config[BASE_KEY])
    else:
        base = BaseIdentity(int(raw_config["hidden_size"]), int(raw_config["vocab_size"]),
                            name_or_path=str(raw_config.get("base_model_name_or_path") or ""))
    if model is not None:
        check_fits(base, model, directory)
        if check_base and "embed_tokens.weight" in state:
            check_embedding(state["embed_tokens.weight"], model, directory)
    # The layer is described by the head's own config.json (the EAGLE repository builds Llama layers only).
    layer_description = {k: v for k, v in raw_config.items() if k != BASE_KEY}
    layer_description.setdefault("model_type", "llama")
    config = EagleConfig(base, layer_description, int(raw_config["num_hidden_layers"]), layout="eagle1",
                         fuse_bias="fc.bias" in state)
    head = cls(config)  # layers of the class its config.json names
    load_state_in_its_dtype(head, our_state(state, head.state_dict(), directory))
    if model is not None:
        head = attach(head, model, base, f"the EAGLE head in {directory!r}", check_identity=check_base)
    return head.eval()


def save_vllm(head, directory, model=None) -> None:
    """Write an "eagle1" `head` as vLLM's EAGLE-1 draft model: a Llama config.json and model.safetensors with
    `fc.weight` and `layers.{i}.*`. vLLM shares the target's embedding and LM head; with the base `model`, its
    embedding is written too (as `embed_tokens.weight`), which SafeAILab/EAGLE's strict loader also needs."""
    config = head.config
    if config.layout == "eagle3":
        raise ValueError("this EAGLE head has the 'eagle3' layout, which vLLM serves from the speculators format: "
                         "save it with format='speculators'")
    if config.layout != "eagle1":
        raise ValueError(
            "this EAGLE head has the 'selfspec' layout: its input norms (feature_norm, embedding_norm), its first "
            "layer's input norm and its output norm have no place in vLLM's EAGLE-1 model, which applies fc to "
            "cat(embedding, feature), then the layers (the first without an input norm), straight to the LM head. "
            f"To serve a head in vLLM, {TRAIN_ONE}"
        )
    if head.draft_vocab is not None:
        raise ValueError(
            f"this EAGLE head drafts among {len(head.draft_vocab)} tokens; vLLM's EAGLE-1 drafter always projects onto "
            "the whole vocabulary, where this head was not trained. Train one with --draft-vocab-size 0 to export it"
        )
    if config.fuse_bias and bool(head.fuse.bias.detach().any()):
        raise ValueError("this EAGLE head's fusion has a bias, and vLLM's EAGLE-1 fc has none (it would be dropped)")
    if head.layer_config.model_type != "llama":
        raise ValueError(
            f"vLLM serves EAGLE-1 heads of Llama layers (EagleLlamaForCausalLM); this head's layers are "
            f"{head.layer_config.model_type!r}"
        )
    if model is not None:
        head.check_base(model, "the EAGLE head being exported")
    dtype = head.fuse.weight.dtype
    state = {"fc.weight": head.fuse.weight}
    state.update({f"layers.{k}": v for k, v in head.layers.state_dict().items()})
    if model is not None:
        state["embed_tokens.weight"] = model.get_input_embeddings().weight
    # clone: a tied embedding shares storage with the LM head, and safetensors refuses shared tensors
    state = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in state.items()}
    vllm_config = head.layer_config.to_dict()
    # runtime fields (attention impl) out; and the base's quantization_config (a GGUF base's): the draft is plain weights
    vllm_config = {k: v for k, v in vllm_config.items() if not k.startswith("_") and k != "quantization_config"}
    vllm_config.update({
        "architectures": [VLLM_ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": config.num_layers,
        "hidden_size": config.base.hidden_size,
        "vocab_size": config.base.vocab_size,
        "bias": False,  # SafeAILab/EAGLE's loader builds fc with a bias unless told otherwise
        "torch_dtype": str(dtype).removeprefix("torch."),  # the key older readers (and vLLM's) know; "dtype" is v5's
        "dtype": str(dtype).removeprefix("torch."),
        BASE_KEY: asdict(config.base),
    })
    add_legacy_rope_keys(vllm_config)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_NAME), "w") as f:
        json.dump(vllm_config, f, indent=2)
    save_file(state, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt"})


def add_legacy_rope_keys(config: dict) -> None:
    """transformers 5 writes RoPE settings as `rope_parameters`; readers on transformers 4 (vLLM's among them) know
    only `rope_theta` and `rope_scaling` and would silently fall back to a theta of 10000: add those two."""
    rope = dict(config.get("rope_parameters") or {})
    if "rope_theta" in rope:
        config["rope_theta"] = rope.pop("rope_theta")
        config["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope


def size_differences(base: BaseIdentity, model) -> list[str]:
    """How `model`'s hidden size and vocabulary differ from those of the base a head was made for, one phrase each."""
    ours = BaseIdentity.of(model)
    differences = []
    if base.hidden_size != ours.hidden_size:
        differences.append(f"hidden size {base.hidden_size}, this model {ours.hidden_size}")
    if base.vocab_size != ours.vocab_size:
        differences.append(f"a vocabulary of {base.vocab_size} tokens, this model {ours.vocab_size}")
    return differences


def check_fits(base: BaseIdentity, model, directory) -> None:
    """Raise a ValueError naming what differs between the base a head was made for and `model`, and what to do."""
    differences = size_differences(base, model)
    if differences:
        raise ValueError(
            f"the EAGLE head in {directory!r} was made for another base ({'; '.join(differences)}). Load it with the "
            f"base it was published for, or {TRAIN_ONE}"
        )


def embedding_differs(embedding: torch.Tensor, model) -> bool:
    """Whether a stored embedding is not `model`'s (published heads and speculators drafts may store the base's)."""
    ours = model.get_input_embeddings().weight.detach()
    theirs = embedding.to(ours.device, ours.dtype)
    return theirs.shape != ours.shape or not torch.allclose(theirs, ours, rtol=1e-2, atol=1e-3)


def check_embedding(embedding: torch.Tensor, model, directory) -> None:
    """Published heads store the base's embedding: one that differs from `model`'s means another base."""
    if embedding_differs(embedding, model):
        raise ValueError(
            f"the EAGLE head in {directory!r} stores an embedding that differs from this model's: it was trained for "
            f"another base of the same shape. Load it with that base, or {TRAIN_ONE}. To force it anyway pass "
            "check_base=False"
        )


def our_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], directory) -> dict[str, torch.Tensor]:
    """Published / vLLM tensor names -> EagleHead's, checked against the head's own state dict (names and shapes)."""
    ours = {}
    for key, value in state.items():
        if key == "embed_tokens.weight" or key.endswith("rotary_emb.inv_freq"):
            continue  # the base's embedding is used at call time; rotary frequencies are rebuilt from the config
        name = "fuse." + key.removeprefix("fc.") if key.startswith("fc.") else key
        if name not in expected:
            raise ValueError(f"{directory!r}: unexpected tensor {key!r}; not an EAGLE-1/2 head of this config")
        if value.shape != expected[name].shape:
            raise ValueError(f"{directory!r}: {key} has shape {tuple(value.shape)}, config.json implies "
                             f"{tuple(expected[name].shape)}")
        ours[name] = value
    missing = sorted(set(expected) - set(ours))
    if missing:
        raise ValueError(
            f"{directory!r}: the weights have no {', '.join(missing)}; the file is incomplete or another layout"
        )
    return ours
