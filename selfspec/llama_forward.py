"""A Llama decoder's forward in plain tensor ops: what `transformers`' `LlamaModel.forward` computes, bit for bit,
without its ~15 module calls a layer.

On a CPU a small model's decode step is mostly Python around the products: SmolLM2 over the int8 kernel spends more
time in `transformers`' module calls, hooks and argument plumbing than in its weights. This forward reads the same
modules' weights and runs the same float operations in the same order (the decoder's own mask builder, rotary
embedding and attention function; RMSNorm, rotary application and the MLP written out as `LlamaRMSNorm`,
`apply_rotary_pos_emb` and `LlamaMLP` compute them), calling the kernel's quantized products directly and fusing
nothing that would change a bit. `LlamaForward.of(model)` builds it only for a plain `LlamaModel` (SiLU MLP, no
biases, sdpa attention, one rotary embedding for every layer, no accelerate hooks) and only after a probe shows it
equal to the decoder's own forward bit for bit (a prefill, a one-token decode, a causal block and a masked block);
any other model keeps the decoder's own forward. A forward or pre-forward hook on any of the decoder's modules (or a
global one), or a module whose forward was replaced, makes `runs_modules()` true: the engine then calls the decoder's
own forward, so what the hooks do is part of the model it decodes. Knows nothing about drafts, sampling or the LM head.
"""
from __future__ import annotations

import operator
from itertools import repeat

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from selfspec.attention_backends import takes_ordered_attention
from selfspec.hf_compat import cache_arg
from selfspec.kernel.attention import ordered_attention, visible_keys
from selfspec.kernel import int8
from selfspec.kernel.llama_layer import KernelLayer
from selfspec.kernel.quantized import QuantizedLinear, QuantizedWeight, kernel_takes


def product(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """layer(x), straight to the kernel for a quantized layer outside compilation (what its forward would call)."""
    if type(layer) is QuantizedLinear and layer.bias is None and not torch.compiler.is_compiling():
        return QuantizedLinear.eager_product(x, layer._weight, layer._backend)
    return layer(x)


class SameInputProducts:
    """Layers that read the same input (a layer's q, k and v; its gate and up), as one product of the kernel's int8
    backend where every one of them takes it: their interleaved blocks moved into one buffer (the modules keep views
    of it, so memory does not grow), one call, one rounding of the input, each output row the same bits as alone
    (the int8 kernel computes every row on its own). Otherwise, or while compiling, each layer's own product."""

    def __init__(self, *layers: torch.nn.Module):
        self.layers = layers
        self.sizes = [layer.out_features for layer in layers]
        self.joined = None
        if all(type(layer) is QuantizedLinear and layer.bias is None for layer in layers) and len(layers) > 1:
            weights = [layer.weight for layer in layers]
            if (len({(w.qtype, w.shape[1], w.interleaved) for w in weights}) == 1
                    and all(w.shape[0] % int8.GROUP_ROWS == 0 for w in weights)):
                blocks = torch.cat([w.blocks for w in weights])
                first = 0
                for layer, weight in zip(layers, weights):
                    rows = blocks[first: first + weight.shape[0]]
                    weight.blocks = layer.blocks = rows
                    first += weight.shape[0]
                self.joined = QuantizedWeight(blocks, weights[0].qtype, weights[0].shape[1])
                self.joined.interleaved = True  # (used only while every part is on the int8 backend: interleaved)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        joined = self.joined_product(x)
        return joined.split(self.sizes, dim=-1) if joined is not None else [product(layer, x) for layer in self.layers]

    def joined_product(self, x: torch.Tensor) -> torch.Tensor | None:
        """[..., sum of out_features]: every layer's output side by side, in one product; None where not joined."""
        if (self.joined is None or torch.compiler.is_compiling() or not kernel_takes(x, self.joined.shape[1])
                or not all(layer._backend == "int8" for layer in self.layers)):
            return None
        return int8.int8_linear(x, self.joined)


# `transformers`' own hooks that record outputs (hidden states, attentions) only while a forward asks for them
_RECORDING_HOOKS = "transformers.utils.output_capturing"


def _acting(hooks: dict) -> bool:
    """Whether a module's hooks include one that may act on a forward (anything but `transformers`' recording)."""
    return any(getattr(hook, "__module__", None) != _RECORDING_HOOKS for hook in hooks.values())


def rms_norm(norm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """`LlamaRMSNorm.forward`'s operations, in its order (its two conversions skipped where they are no-ops)."""
    dtype = hidden.dtype
    if dtype is not torch.float32:
        hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * (hidden if dtype is torch.float32 else hidden.to(dtype))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rotary_pos_emb` for one tensor [B, heads, n, head_dim] with cos / sin [B, 1, n, head_dim] (or the same
    elementwise, [B, n, heads, head_dim] with [B, n, 1, head_dim])."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaForward:
    """The forward of one `LlamaModel` (see the module). Build with `LlamaForward.of(model)`."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.config = decoder.config
        self.layers = list(decoder.layers[: self.config.num_hidden_layers])
        # each module's hook dicts (mutated in place by register_*_hook), and the attribute dicts of the modules whose
        # forward this one replaces (it calls a Linear's forward: a patch there is honoured)
        self.hook_dicts = [hooks for m in decoder.modules() for hooks in (m._forward_hooks, m._forward_pre_hooks)]
        self.replaced_forward_dicts = [m.__dict__ for m in decoder.modules() if type(m) is not torch.nn.Linear]
        self.qkv = [SameInputProducts(l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj) for l in self.layers]
        self.gate_up = [SameInputProducts(l.mlp.gate_proj, l.mlp.up_proj) for l in self.layers]
        self.kernel_layers: list = []  # per layer, its KernelLayer or None (`of`, once the probe has passed)

    @classmethod
    def of(cls, model) -> "LlamaForward | None":
        """The plain forward of `model`'s decoder, or None where it is not a plain Llama or the probe differs."""
        from transformers.models.llama import modeling_llama as llama

        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        config = getattr(decoder, "config", None)
        if type(decoder) is not llama.LlamaModel or config is None or config._attn_implementation != "sdpa":
            return None
        layers = decoder.layers[: config.num_hidden_layers]
        plain = (
            getattr(config, "hidden_act", None) == "silu" and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False) and type(decoder.rotary_emb) is llama.LlamaRotaryEmbedding
            and type(decoder.norm) is llama.LlamaRMSNorm
            and all(type(layer) is llama.LlamaDecoderLayer and type(layer.self_attn) is llama.LlamaAttention
                    and type(layer.mlp) is llama.LlamaMLP and type(layer.input_layernorm) is llama.LlamaRMSNorm
                    and type(layer.post_attention_layernorm) is llama.LlamaRMSNorm for layer in layers)
        )
        # (accelerate's hooks move or load weights around each module's forward, which this forward does not call)
        if not plain or any(hasattr(module, "_hf_hook") for module in decoder.modules()):
            return None
        forward = cls(decoder)
        if not forward.reproduces_decoder():
            return None
        # (after the probe: the kernel's layers compute the GGUF model in their own float operations, not the
        # decoder's bits; `kernel/llama_layer.py` says why that keeps drafting exact)
        forward.kernel_layers = [KernelLayer.of(layer) for layer in forward.layers]
        return forward

    def runs_modules(self) -> bool:
        """Whether a hook (forward or pre-forward, on a decoder module or global) or a module's replaced forward asks
        for the decoder's own module calls now (checked at every forward, in C-level loops over the modules)."""
        from torch.nn.modules import module as nn_module

        return (bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks)
                or any(map(_acting, filter(None, self.hook_dicts)))
                or any(map(operator.contains, self.replaced_forward_dicts, repeat("forward"))))

    def __call__(self, input_ids: torch.Tensor, cache, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, feature_layers: tuple[int, ...] = ()):
        """[B, n] ids after the cache's contents -> ([B, n, hidden] final normed states, [the input of decoder layer
        l for l in feature_layers]); attention_mask / position_ids as the decoder's own forward takes them."""
        hidden, features = self.run_layers(self.decoder.embed_tokens(input_ids), cache, 0, len(self.layers),
                                           attention_mask, position_ids, feature_layers)
        return rms_norm(self.decoder.norm, hidden), features

    def run_layers(self, hidden: torch.Tensor, cache, start: int, end: int, attention_mask: torch.Tensor | None = None,
                   position_ids: torch.Tensor | None = None, feature_layers: tuple[int, ...] = ()):
        """[B, n, hidden] input of layer `start` -> ([B, n, hidden] output of layer `end - 1`, before the final norm;
        [the input of layer l for l in feature_layers]). The tokens sit after what layer `start` has cached (early
        exit runs ahead in the first layers); each layer writes their keys and values."""
        if position_ids is None:
            past = cache.get_seq_length(start)
            position_ids = torch.arange(past, past + hidden.shape[1], device=hidden.device)[None]
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                  **cache_arg(cache), position_ids=position_ids, layer_idx=start)
        cos, sin = self.decoder.rotary_emb(hidden, position_ids=position_ids)
        # for [B, heads, n, d] and for [B, n, heads, d]
        rotary = cos[:, None], sin[:, None], cos[:, :, None], sin[:, :, None]
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, None)
        kernel = ()  # the layers' KernelLayer (or None), where every forward of this kind runs through them
        if takes_ordered_attention(attend):  # (the mask read once here, not once a layer)
            batch, width = hidden.shape[:2]
            applies, visible = visible_keys(mask, batch, width, cache.get_seq_length(start) + width)
            head_dim = self.layers[0].self_attn.head_dim
            if applies and hidden.dtype is torch.float32 and hidden.is_cpu and head_dim % 8 == 0:
                visible = None if visible is None else visible.to(torch.uint8).contiguous()
                kernel = self.kernel_layers
                kernel_rotary = cos.expand(batch, width, -1).contiguous(), sin.expand(batch, width, -1).contiguous()

                def attend(attn, query, key, value, _mask, **_):
                    return ordered_attention(query, key, value, visible, attn.scaling), None
        features, owned = {}, False  # owned: hidden is this forward's own tensor (the kernel's layers update it in place)
        for index in range(start, end):
            layer = self.layers[index]
            if index in feature_layers:
                features[index], owned = hidden, False
            kernel_layer = kernel[index] if kernel else None
            if kernel_layer is not None and kernel_layer.active():
                if not owned:
                    hidden, owned = hidden.clone(memory_format=torch.contiguous_format), True
                query, key, value = kernel_layer.attention_in(hidden, *kernel_rotary)
                key, value = cache.update(key, value, layer.self_attn.layer_idx)
                kernel_layer.attention_out(hidden, query, key, value, visible)
                continue
            hidden = hidden + self._attention(layer.self_attn, self.qkv[index], rms_norm(layer.input_layernorm, hidden),
                                              rotary, mask, cache, attend)
            gate, up = self.gate_up[index](rms_norm(layer.post_attention_layernorm, hidden))
            hidden, owned = hidden + product(layer.mlp.down_proj, F.silu(gate) * up), True
        return hidden, [features[l] for l in feature_layers]

    @staticmethod
    def _attention(attn, qkv: SameInputProducts, x: torch.Tensor, rotary, mask, cache, attend) -> torch.Tensor:
        rows = x.shape[:-1]
        cos, sin, cos_by_token, sin_by_token = rotary
        joined = qkv.joined_product(x)
        if joined is not None:  # [B, n, q + k + v heads, d]: q's and k's heads rotated together
            heads = joined.view(*rows, -1, attn.head_dim)
            query_heads = qkv.sizes[0] // attn.head_dim
            rotating = query_heads + qkv.sizes[1] // attn.head_dim
            rotated = rotate(heads[..., :rotating, :], cos_by_token, sin_by_token)
            query = rotated[..., :query_heads, :].transpose(1, 2)
            key = rotated[..., query_heads:, :].transpose(1, 2)
            value = heads[..., rotating:, :].transpose(1, 2)
        else:
            shape = (*rows, -1, attn.head_dim)
            query, key, value = (y.view(shape).transpose(1, 2) for y in qkv(x))
            query, key = rotate(query, cos, sin), rotate(key, cos, sin)
        key, value = cache.update(key, value, attn.layer_idx)
        out, _ = attend(attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling)
        return product(attn.o_proj, out.reshape(*rows, -1).contiguous())

    @torch.no_grad()
    def reproduces_decoder(self) -> bool:
        """Whether a prefill of 4 tokens, a one-token decode, a causal block of 2 and a block of 2 under an additive
        4D mask (a tree's or a batch's) give the decoder's own states and features bit for bit (under the attention
        the engine's forwards take for this model)."""
        from selfspec.attention_backends import additive_mask, engine_attention_context

        device = self.decoder.embed_tokens.weight.device
        vocab = self.config.vocab_size
        probe = (torch.arange(9, device=device) * 7 + 3)[None] % vocab
        layers = tuple(range(self.config.num_hidden_layers))
        ours, theirs = DynamicCache(config=self.config), DynamicCache(config=self.config)
        with engine_attention_context(self.decoder):
            for block, masked in ((probe[:, :4], False), (probe[:, 4:5], False), (probe[:, 5:7], False),
                                  (probe[:, 7:], True)):
                past = ours.get_seq_length()
                visible = torch.ones(block.shape[1], past + block.shape[1], dtype=torch.bool, device=device).tril(past)
                mask = additive_mask(visible, self.decoder.embed_tokens.weight.dtype)[None, None] if masked else None
                got, features = self(block, ours, mask, feature_layers=layers)
                expected = self.decoder(input_ids=block, attention_mask=mask, **cache_arg(theirs), use_cache=True,
                                        output_hidden_states=True)
                if not (torch.equal(got, expected.last_hidden_state)
                        and all(torch.equal(f, expected.hidden_states[l]) for f, l in zip(features, layers))):
                    return False
        return True
