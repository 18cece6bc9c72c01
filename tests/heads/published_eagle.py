"""Published EAGLE-1/2 heads for tests, written without selfspec: a reference forward of the published math and a
writer of the published directory layout (both from the facts in `heads/eagle_formats.py`, never from its code)."""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

LAYER_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")


def published_config(model, intermediate_size: int | None = None, bias: bool = True) -> dict:
    """config.json of a published head for `model`: a Llama config with one layer, written as EAGLE's (transformers 4
    keys: rope_theta), and EAGLE's own `bias` flag for its fc."""
    config = model.config
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": config.hidden_size,
        "intermediate_size": intermediate_size or config.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size, "rms_norm_eps": config.rms_norm_eps, "rope_theta": 10000.0,
        "rope_scaling": None, "max_position_embeddings": config.max_position_embeddings, "hidden_act": "silu",
        "torch_dtype": "float16", "bias": bias,
    }


def random_published_weights(model, config: dict, seed: int = 0, bias: bool = True) -> dict[str, torch.Tensor]:
    """A published head's tensors, random but of a trained head's scale, plus the base's embedding (as EAGLE stores)."""
    g = torch.Generator().manual_seed(seed)
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    kv = hidden // config["num_attention_heads"] * config["num_key_value_heads"]
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (inner, hidden), "mlp.up_proj": (inner, hidden),
              "mlp.down_proj": (hidden, inner)}

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    weights = {"embed_tokens.weight": model.get_input_embeddings().weight.detach().clone(),
               "fc.weight": rand(hidden, 2 * hidden, scale=0.15)}
    if bias:
        weights["fc.bias"] = rand(hidden, scale=0.1)
    for name in LAYER_NAMES:
        weights[f"layers.0.{name}.weight"] = rand(*shapes[name])
    weights["layers.0.post_attention_layernorm.weight"] = 1.0 + rand(hidden, scale=0.1)
    return weights


def write_published(directory, weights: dict[str, torch.Tensor], config: dict, file: str = "pytorch_model.bin") -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    if file.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(directory, file))
    else:
        torch.save(weights, os.path.join(directory, file))


def reference_eagle1(weights: dict[str, torch.Tensor], config: dict, features: torch.Tensor,
                     embeddings: torch.Tensor) -> torch.Tensor:
    """The published head over one sequence: features [T, H] (the base's post-norm h_t), embeddings [T, H] (of token
    t+1) -> [T, H] predicted features, which go to the LM head as they are. Causal attention at positions 0..T-1."""
    w = {k: v.to(features.dtype) for k, v in weights.items()}
    T, hidden = features.shape
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = hidden // heads
    x = torch.cat([embeddings, features], dim=-1) @ w["fc.weight"].T  # embedding first
    if "fc.bias" in w:
        x = x + w["fc.bias"]

    def project(name, t):
        return t @ w[f"layers.0.{name}.weight"].T

    # attention on x as it is: layer 0 has no input norm
    q = project("self_attn.q_proj", x).view(T, heads, d).transpose(0, 1)  # [heads, T, d]
    k = project("self_attn.k_proj", x).view(T, kv_heads, d).transpose(0, 1)
    v = project("self_attn.v_proj", x).view(T, kv_heads, d).transpose(0, 1)
    inv_freq = 1.0 / config["rope_theta"] ** (torch.arange(0, d, 2, dtype=x.dtype) / d)
    angles = torch.arange(T, dtype=x.dtype)[:, None] * inv_freq[None]  # [T, d/2]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rotate(t):
        return t * cos + torch.cat([-t[..., d // 2 :], t[..., : d // 2]], dim=-1) * sin

    q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = (q @ k.transpose(-1, -2)) / d**0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.inf)
    x = x + project("self_attn.o_proj", (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, hidden))
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config["rms_norm_eps"])
    normed = normed * w["layers.0.post_attention_layernorm.weight"]
    gate = project("mlp.gate_proj", normed)
    return x + project("mlp.down_proj", gate * torch.sigmoid(gate) * project("mlp.up_proj", normed))  # no final norm
