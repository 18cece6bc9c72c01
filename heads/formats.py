"""Other checkpoint formats for Medusa heads: published Medusa heads (read), vLLM's Medusa layout (write and read).

Knows file layouts and key names only; the head architecture is `heads/medusa.py`'s. The layouts were checked
against FasterDecoding/Medusa (`medusa/model/medusa_model.py`), text-generation-inference
(`server/text_generation_server/layers/medusa.py`) and vLLM (`vllm/model_executor/models/medusa.py`,
`vllm/transformers_utils/configs/medusa.py`):

- Published Medusa: `medusa_lm_head.safetensors` or `.pt` holding the state dict of an `nn.ModuleList` of
  `nn.Sequential(ResBlock * num_layers, Linear(H, V, bias=False))`: `{i}.{j}.linear.weight` [H, H] and
  `.bias` [H] for j < num_layers, then `{i}.{num_layers}.weight` [V, H]. "Version 2" files (TGI's
  MedusaHeadV2) have no `{i}.{num_layers}.weight`: every head goes through the base LM head. The number of
  heads is not reliably in config.json (servers take it from a command-line flag), so we count tensors.
- vLLM: config.json with `model_type: "medusa"`, `num_heads`, `num_hidden_layers`, `truncated_vocab_size`,
  `medusa_fc_bias`, `original_lm_head`; weights `blocks.{i}.layers.{j}.weight` / `.bias` (x + SiLU(W x + b),
  the same block as ours) and `lm_heads.{i}.weight`; with `original_lm_head: true` vLLM builds ONE LM head for
  all heads and fills it from `lm_heads.0.weight`. A draft vocabulary is a `token_map` tensor ([N] target ids, draft
  index i scoring token_map[i]) with `truncated_vocab_size: N` < `vocab_size`: the one LM head then has N rows (taken
  by token_map from a full-vocabulary `lm_heads.0.weight`, as they are from one of N rows) and logits are -inf
  outside the map. Own LM heads (`original_lm_head: false`) are always built over the whole vocabulary, and loading a
  token_map with them fails (the rows it selects no longer fit), so vLLM has no draft vocabulary for them.
"""
from __future__ import annotations

import json
import os
import re

import torch
from safetensors.torch import load_file, save_file

from heads.checkpoint import (
    CONFIG_NAME, WEIGHTS_NAME, BaseIdentity, lm_head_shape, lm_head_weight, load_state_in_its_dtype,
)

PUBLISHED_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
VLLM_MODEL_TYPE = "medusa"
_PREFIXES = ("medusa_head.", "medusa_heads.")  # some trainers save the parent module's state dict


def load_published_medusa(directory, raw_config: dict, model=None, build=None):
    """Published Medusa heads (or a vLLM export) in `directory` -> MedusaHeads on the CPU, made by
    `build(num_heads, num_layers, share_lm_head, base)` (`MedusaHeads.build`: this module knows layouts, not classes).

    `model` is needed only when the file has no LM projections of its own and config.json names no vocab size.
    """
    if raw_config.get("model_type") == VLLM_MODEL_TYPE and os.path.isfile(os.path.join(directory, WEIGHTS_NAME)):
        return load_vllm(directory, raw_config, model, build)
    state = _read_published_weights(directory)
    block = re.compile(r"(\d+)\.(\d+)\.linear\.weight")
    layers_per_head: dict[int, set[int]] = {}
    for key in state:
        match = block.fullmatch(key)
        if match:
            layers_per_head.setdefault(int(match[1]), set()).add(int(match[2]))
    if not layers_per_head:
        raise ValueError(f"{directory!r}: no Medusa head tensors (keys like '0.0.linear.weight') in the weights file")
    num_heads = max(layers_per_head) + 1
    num_layers = len(layers_per_head[0])
    for i in range(num_heads):
        if layers_per_head.get(i) != set(range(num_layers)):
            raise ValueError(
                f"{directory!r}: head {i} has residual blocks {sorted(layers_per_head.get(i, ()))}, "
                f"expected 0..{num_layers - 1} like head 0; the file is incomplete or not Medusa heads"
            )
    stated = raw_config.get("medusa_num_layers")
    if stated is not None and stated != num_layers:
        raise ValueError(
            f"{directory!r}: config.json says medusa_num_layers={stated} but the weights hold {num_layers} per head"
        )
    own = [f"{i}.{num_layers}.weight" in state for i in range(num_heads)]
    if any(own) and not all(own):
        raise ValueError(f"{directory!r}: only some heads have their own LM projection ('{{i}}.{num_layers}.weight')")
    share_lm_head = not all(own)
    hidden_size = state["0.0.linear.weight"].shape[1]
    if share_lm_head:
        vocab_size = _vocab_size(model, raw_config, directory)
    else:
        vocab_size = state[f"0.{num_layers}.weight"].shape[0]
    base = BaseIdentity(
        hidden_size=hidden_size, vocab_size=vocab_size, name_or_path=str(raw_config.get("base_model_name_or_path", ""))
    )
    heads = build(num_heads, num_layers, share_lm_head, base)
    ours = {}
    for i in range(num_heads):
        for j in range(num_layers):
            ours[f"blocks.{i}.{j}.linear.weight"] = _tensor(state, f"{i}.{j}.linear.weight", directory)
            ours[f"blocks.{i}.{j}.linear.bias"] = _tensor(state, f"{i}.{j}.linear.bias", directory)
        if not share_lm_head:
            ours[f"lm_heads.{i}.weight"] = _tensor(state, f"{i}.{num_layers}.weight", directory)
    _load_exact(heads, ours, directory)
    return heads


def save_vllm(heads, directory, model=None) -> None:
    """Write `heads` as vLLM's Medusa draft model. With a shared LM head vLLM needs the base LM head in the file,
    so pass the base `model` (its LM head weight is written as `lm_heads.0.weight`)."""
    config = heads.config
    draft_vocab = heads.draft_vocab  # [N] ids or None
    if draft_vocab is not None and not config.share_lm_head:
        raise ValueError(
            f"these heads draft among {len(draft_vocab)} tokens with their own LM heads; vLLM's Medusa takes a draft "
            "vocabulary (token_map) only with one LM head shared by all heads, and would draft over the whole "
            "vocabulary with own LM heads, whose rows outside it were never trained. Train heads that share the base's "
            "LM head (the default; without --no-share-lm-head) or with --draft-vocab-size 0 to export them"
        )
    if config.share_lm_head and model is None:
        raise ValueError(
            "these heads share the base model's LM head, and vLLM reads it from the heads' own file: "
            "pass the base model, e.g. heads.save_pretrained(dir, format='vllm', model=model)"
        )
    if model is not None:
        heads.check_base(model, "the heads being exported")
    state = {}
    for i, blocks in enumerate(heads.blocks):
        for j, block in enumerate(blocks):
            state[f"blocks.{i}.layers.{j}.weight"] = block.linear.weight
            state[f"blocks.{i}.layers.{j}.bias"] = block.linear.bias
    if config.share_lm_head:  # [N, H] the draft vocabulary's rows (a quantized LM head's values, dequantized)
        state["lm_heads.0.weight"] = lm_head_weight(model, draft_vocab)
    else:
        for i, lm_head in enumerate(heads.lm_heads):
            state[f"lm_heads.{i}.weight"] = lm_head.weight
    dtype = next(heads.parameters()).dtype
    # clone: a tied LM head shares storage with the embedding, and safetensors refuses shared tensors
    state = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in state.items()}
    if draft_vocab is not None:
        state["token_map"] = draft_vocab.detach().to("cpu", torch.int64).contiguous().clone()
    vllm_config = {
        "model_type": VLLM_MODEL_TYPE,
        "architectures": ["MedusaModel"],
        "hidden_size": config.base.hidden_size,
        "vocab_size": config.base.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        # vLLM asserts equality without a token map
        "truncated_vocab_size": config.base.vocab_size if draft_vocab is None else len(draft_vocab),
        "medusa_fc_bias": True,  # our blocks have biases; vLLM's default is False
        "original_lm_head": config.share_lm_head,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "base_model_name_or_path": config.base.name_or_path,
    }
    logit_scale = getattr(getattr(model, "config", None), "logit_scale", None)
    if logit_scale is not None:  # vLLM's Medusa reads `logit_scale` from its own config
        vllm_config["logit_scale"] = logit_scale
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_NAME), "w") as f:
        json.dump(vllm_config, f, indent=2)
    save_file(state, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt"})


def load_vllm(directory, raw_config: dict, model=None, build=None):
    """Read back what `save_vllm` (or another vLLM Medusa export) wrote; a `token_map` becomes the draft vocabulary."""
    state = load_file(os.path.join(directory, WEIGHTS_NAME))
    state = {_strip_prefix(k): v for k, v in state.items()}
    num_heads, num_layers = raw_config["num_heads"], raw_config["num_hidden_layers"]
    share_lm_head = bool(raw_config.get("original_lm_head", False))
    vocab_size = raw_config["vocab_size"]
    truncated = raw_config.get("truncated_vocab_size") or vocab_size
    token_map = state.pop("token_map", None) if truncated < vocab_size else None  # (vLLM ignores it otherwise)
    if truncated < vocab_size and (token_map is None or not share_lm_head or token_map.shape != (truncated,)
                                   or not 0 <= int(token_map.min()) <= int(token_map.max()) < vocab_size
                                   or token_map.unique().numel() != truncated):
        raise ValueError(f"{directory!r}: truncated_vocab_size {truncated} < vocab_size {vocab_size} needs a token_map "
                         f"of {truncated} distinct ids below {vocab_size} and original_lm_head (what vLLM loads); this "
                         "export does not have them")
    base = BaseIdentity(
        hidden_size=raw_config["hidden_size"], vocab_size=vocab_size,
        name_or_path=str(raw_config.get("base_model_name_or_path", "")),
    )
    heads = build(num_heads, num_layers, share_lm_head, base, 0 if token_map is None else truncated)
    ours = {}
    for i in range(num_heads):
        for j in range(num_layers):
            ours[f"blocks.{i}.{j}.linear.weight"] = _tensor(state, f"blocks.{i}.layers.{j}.weight", directory)
            bias = state.get(f"blocks.{i}.layers.{j}.bias")
            ours[f"blocks.{i}.{j}.linear.bias"] = bias if bias is not None else torch.zeros(base.hidden_size)
        if not share_lm_head:
            ours[f"lm_heads.{i}.weight"] = _tensor(state, f"lm_heads.{i}.weight", directory)
    if token_map is not None:
        ours["draft_vocab"] = token_map.long()
    _load_exact(heads, ours, directory)
    return heads


def _read_published_weights(directory) -> dict[str, torch.Tensor]:
    for name in PUBLISHED_WEIGHTS:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            state = load_file(path) if name.endswith(".safetensors") else torch.load(path, map_location="cpu", weights_only=True)
            return {_strip_prefix(k): v for k, v in state.items()}
    raise FileNotFoundError(
        f"{directory!r} is neither a selfspec heads directory (config.json 'format': 'selfspec-medusa') nor published "
        f"Medusa heads (no {' or '.join(PUBLISHED_WEIGHTS)})"
    )


def _strip_prefix(key: str) -> str:
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def _tensor(state: dict[str, torch.Tensor], key: str, directory) -> torch.Tensor:
    if key not in state:
        raise ValueError(f"{directory!r}: the weights file has no tensor {key!r}; it is incomplete or another layout")
    return state[key]


def _vocab_size(model, raw_config: dict, directory) -> int:
    if model is not None:
        return lm_head_shape(model)[0]
    if raw_config.get("vocab_size"):
        return int(raw_config["vocab_size"])
    raise ValueError(
        f"the Medusa heads in {directory!r} reuse the base model's LM head and config.json names no vocab_size: "
        "load them with the base, MedusaHeads.from_pretrained(dir, model=model)"
    )


def _load_exact(heads, state: dict[str, torch.Tensor], directory) -> None:
    expected = heads.state_dict()
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise ValueError(f"{directory!r}: {key} has shape {tuple(value.shape)}, expected {tuple(expected[key].shape)}")
    load_state_in_its_dtype(heads, state)
