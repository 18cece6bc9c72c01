"""Layer-level access to a `transformers` decoder: embed, run a range of layers through the shared cache, final norm.

Early exit needs what a decoder's `forward` does not offer: run only layers [start, end) and resume later from
a hidden state. This adapter reaches the public parts of the decoder module (embeddings, layer stack, final norm,
rotary embeddings) and builds masks with `transformers.masking_utils`, exactly as the modeling files do, without
copying modeling code and without touching the model's config. Three layouts cover the supported families:

    llama layout:    embed_tokens, layers, norm, rotary_emb                  (Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3)
    gpt_neox layout: embed_in, emb_dropout, layers, final_layer_norm, rotary_emb; layers take `layer_past` (GPT-NeoX)
    gpt2 layout:     wte, wpe, drop, h, ln_f                                 (GPT-2)

A rotary embedding that takes the layer type (Gemma 3: local and global layers rotate differently) is called once
per layer type in the range. At wrap time it checks that the layers and the rotary embedding take nothing this
adapter does not pass, then proves, on a short probe, that running the layers in two pieces reproduces the
decoder's own forward; a family that does more between its layers (embedding multipliers, per-layer extras) is
refused there with a NotImplementedError naming the reason, never a TypeError at generate time. Knows nothing
about drafts, sampling or the LM head.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from selfspec.hf_compat import CACHE_ARG, cache_arg

SUPPORTED_FAMILIES = "Llama, Mistral, Qwen2, Qwen3, Gemma (1-3), Phi-3, GPT-NeoX and GPT-2"
# What run_layers passes to each layer, besides the hidden states and the cache (under the layout's cache keyword).
_LAYER_ARGUMENTS = {"attention_mask", "position_ids", "use_cache", "position_embeddings"}


@dataclass(frozen=True)
class _Layout:
    name: str
    embed: str  # token embedding module (Gemma's scales itself)
    layers: str  # nn.ModuleList of decoder layers
    norm: str  # final norm, applied before the LM head
    rotary: str | None  # rotary embedding module giving (cos, sin) per position
    positions: str | None  # learned position embedding module (GPT-2)
    dropout: str | None  # embedding dropout (identity in eval mode, kept for fidelity)
    cache_arg: str = CACHE_ARG  # the keyword under which a layer takes the KV cache


LAYOUTS = (
    _Layout("llama", embed="embed_tokens", layers="layers", norm="norm", rotary="rotary_emb", positions=None, dropout=None),
    _Layout(
        "gpt_neox", embed="embed_in", layers="layers", norm="final_layer_norm", rotary="rotary_emb", positions=None,
        dropout="emb_dropout", cache_arg="layer_past",
    ),
    _Layout("gpt2", embed="wte", layers="h", norm="ln_f", rotary=None, positions="wpe", dropout="drop"),
)


class ModelParts:
    """The parts of one decoder module, called layer by layer. Build with `ModelParts.of(model)`."""

    def __init__(self, model, decoder: nn.Module, layout: _Layout):
        self.model = model
        self.decoder = decoder
        self.layout = layout
        self.config = decoder.config
        self.embed_tokens = getattr(decoder, layout.embed)
        self.layers = getattr(decoder, layout.layers)
        self.norm = getattr(decoder, layout.norm)
        self.rotary_emb = getattr(decoder, layout.rotary) if layout.rotary else None
        self.position_embeddings = getattr(decoder, layout.positions) if layout.positions else None
        self.dropout = getattr(decoder, layout.dropout, None) if layout.dropout else None
        # The modeling files iterate `layers[: config.num_hidden_layers]`; so do we.
        self.num_layers = self.config.num_hidden_layers
        # Gemma 3 style: rotary_emb(x, position_ids, layer_type), one (cos, sin) per kind of layer.
        self.layer_types = None
        if self.rotary_emb is not None and "layer_type" in inspect.signature(self.rotary_emb.forward).parameters:
            self.layer_types = list(self.config.layer_types)

    @classmethod
    def of(cls, model) -> "ModelParts":
        """Find the layout of `model`'s decoder; raise NotImplementedError naming what is missing."""
        name = type(model).__name__
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        if not isinstance(decoder, nn.Module) or decoder is model:
            raise NotImplementedError(
                f"early exit needs {name}'s decoder module (get_decoder()), which it does not expose; "
                f"early exit supports {SUPPORTED_FAMILIES}"
            )
        missing_by_layout = {}
        for layout in LAYOUTS:
            wanted = [a for a in (layout.embed, layout.layers, layout.norm, layout.rotary, layout.positions) if a]
            missing = [a for a in wanted if not isinstance(getattr(decoder, a, None), nn.Module)]
            if not isinstance(getattr(decoder, layout.layers, None), nn.ModuleList):
                missing = sorted(set(missing) | {layout.layers})
            if not missing:
                parts = cls(model, decoder, layout)
                parts._check_signatures()
                try:
                    from selfspec.attention_backends import engine_attention_context

                    with engine_attention_context(model):  # (as decoding will compute: int8 products, ordered attention)
                        parts._check()
                except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as err:
                    raise NotImplementedError(
                        f"early exit cannot run {name}'s decoder ({type(decoder).__name__}) layer by layer as a "
                        f"{layout.name}-style decoder ({type(err).__name__}: {err}); early exit supports "
                        f"{SUPPORTED_FAMILIES}; other drafters (ngram, medusa) work on any causal LM"
                    ) from err
                return parts
            missing_by_layout[layout.name] = missing
        described = "; ".join(f"as a {k}-style decoder it lacks {', '.join(v)}" for k, v in missing_by_layout.items())
        raise NotImplementedError(
            f"early exit cannot run {name}'s decoder ({type(decoder).__name__}) layer by layer: {described}. "
            f"Supported families: {SUPPORTED_FAMILIES}; other drafters (ngram, medusa) work on any causal LM."
        )

    def embed(self, token_ids: torch.Tensor, cache: DynamicCache,
              position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, num_tokens] ids appended after layer 0's cached tokens -> [B, num_tokens, hidden] input of layer 0.
        position_ids [B, num_tokens]: a batch's ragged rows (`RaggedCache.block_positions`); None: after layer 0's
        cached tokens."""
        hidden = self.embed_tokens(token_ids)
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = self._position_ids(hidden, cache, 0)
            hidden = hidden + self.position_embeddings(position_ids)
        return self.dropout(hidden) if self.dropout is not None else hidden

    def run_layers(self, hidden: torch.Tensor, cache: DynamicCache, start: int, end: int,
                   attention_mask: torch.Tensor | None = None,
                   position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, num_tokens, hidden] input of layer `start` -> output of layer `end - 1` (before the final norm).

        The tokens sit after what layer `start` has cached; each layer writes their keys and values. Layers may
        hold different lengths (early exit runs ahead in the first layers), so positions and masks are taken from
        the layer where this range starts, not from layer 0 as the decoder's own forward does. A batch's ragged rows
        pass their own 4D `attention_mask` and `position_ids` [B, num_tokens] (`RaggedCache`: full-attention layers
        only), which every layer takes as the decoder's own forward takes a prepared 4D mask: as it is.
        """
        if not 0 <= start <= end <= self.num_layers:
            raise ValueError(f"layer range [{start}, {end}) is outside the model's {self.num_layers} layers")
        if position_ids is None:
            position_ids = self._position_ids(hidden, cache, start)
        rotary = self._rotary(hidden, position_ids, range(start, end))  # layer type (or None) -> (cos, sin)
        if attention_mask is not None and any(cache.is_sliding[start:end]):
            raise ValueError("a prepared 4D mask serves full-attention layers only; these layers include sliding ones")
        # sliding or not -> mask, sized against the first layer of that kind in the range (or the one given)
        masks = {} if attention_mask is None else {False: attention_mask}
        for i in range(start, end):
            sliding = cache.is_sliding[i]
            if sliding not in masks:
                make_mask = create_sliding_window_causal_mask if sliding else create_causal_mask
                masks[sliding] = make_mask(
                    config=self.config, inputs_embeds=hidden, attention_mask=None, **cache_arg(cache),
                    position_ids=position_ids, layer_idx=i,
                )
            extra = {self.layout.cache_arg: cache}
            if rotary:
                extra["position_embeddings"] = rotary[self.layer_types[i] if self.layer_types else None]
            hidden = self.layers[i](hidden, attention_mask=masks[sliding], position_ids=position_ids, use_cache=True, **extra)
        return hidden

    def _rotary(self, hidden: torch.Tensor, position_ids: torch.Tensor, layers: range) -> dict:
        """{layer type: (cos, sin)} for the layers in `layers` ({None: ...} when every layer rotates alike; {} when
        the decoder has no rotary embedding)."""
        if self.rotary_emb is None:
            return {}
        if self.layer_types is None:
            return {None: self.rotary_emb(hidden, position_ids)}
        kinds = {self.layer_types[i] for i in layers}
        return {kind: self.rotary_emb(hidden, position_ids, layer_type=kind) for kind in kinds}

    def _check_signatures(self) -> None:
        """Refuse, naming the argument, a decoder whose layers or rotary embedding need what run_layers does not pass
        (or that would silently drop the cache into **kwargs)."""
        decoder = type(self.decoder).__name__
        layer = inspect.signature(self.layers[0].forward).parameters
        if self.layout.cache_arg not in layer:
            raise NotImplementedError(
                f"{decoder}'s layers do not name a `{self.layout.cache_arg}` argument, so early exit cannot hand them "
                f"the shared cache; early exit supports {SUPPORTED_FAMILIES}"
            )
        known = _LAYER_ARGUMENTS | {self.layout.cache_arg}
        required = [n for n, p in list(layer.items())[1:] if _required(p) and n not in known]
        if self.rotary_emb is not None:
            rotary = inspect.signature(self.rotary_emb.forward).parameters
            required += [f"rotary_emb({n})" for n, p in list(rotary.items())[2:] if _required(p) and n != "layer_type"]
        if required:
            raise NotImplementedError(
                f"{decoder}'s layers need {', '.join(required)}, which early exit does not know how to give them; "
                f"early exit supports {SUPPORTED_FAMILIES}; other drafters (ngram, medusa) work on any causal LM"
            )

    @staticmethod
    def _position_ids(hidden: torch.Tensor, cache: DynamicCache, layer_idx: int) -> torch.Tensor:
        past = cache.layers[layer_idx].get_seq_length()
        return torch.arange(past, past + hidden.shape[1], device=hidden.device)[None]  # [1, num_tokens]

    @torch.no_grad()
    def _check(self) -> None:
        """Prefill 4 tokens through all layers, then 2 more split at the middle layer; both must match the decoder."""
        device = next(self.decoder.parameters()).device
        vocab = self.embed_tokens.weight.shape[0]
        probe = (torch.arange(6, device=device) * 7 + 3)[None] % vocab  # [1, 6]
        expected = self.decoder(input_ids=probe, **cache_arg(DynamicCache(config=self.model.config)), use_cache=True)
        expected = expected.last_hidden_state[0]
        cache = DynamicCache(config=self.model.config)
        first = self.norm(self.run_layers(self.embed(probe[:, :4], cache), cache, 0, self.num_layers))
        split = max(1, self.num_layers // 2)
        rest = self.run_layers(self.embed(probe[:, 4:], cache), cache, 0, split)
        rest = self.norm(self.run_layers(rest, cache, split, self.num_layers))
        got = torch.cat([first[0], rest[0]])
        tolerance = 1e-2 if expected.dtype in (torch.float16, torch.bfloat16) else 1e-4
        scale = expected.abs().max().clamp_min(1.0)
        if got.shape != expected.shape or (got - expected).abs().max() > tolerance * scale:
            raise NotImplementedError(
                f"running {type(self.decoder).__name__}'s layers one by one does not reproduce its own forward "
                f"(it does something between its layers that the {self.layout.name} layout does not know); "
                f"early exit supports {SUPPORTED_FAMILIES}"
            )


def _required(parameter: inspect.Parameter) -> bool:
    return parameter.default is inspect.Parameter.empty and parameter.kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD,
    )
