"""EAGLE-style draft head: one decoder layer of the base's own architecture that runs autoregressively on the base's
features. Input at position t: a feature of position t and the embedding of token t+1; output: a predicted feature for
position t+1, which the base's LM head (optionally restricted to a draft vocabulary) turns into a guess for token t+2,
and which is fed back as the next input's feature.

Three layouts of the same idea (`EagleConfig.layout`):

    "selfspec" (ours, the default):
        fused = W [rmsnorm(h_t); rmsnorm(embed(x_{t+1}))]        (2H -> H)
        f_{t+1} = norm(decoder_layer(fused))
    "eagle1" (published EAGLE-1/2 heads and vLLM's EAGLE-1 drafter, see `heads/eagle_formats.py`):
        fused = W [embed(x_{t+1}); h_t] (+ b)                    (embedding first, neither normed)
        f_{t+1} = decoder_layer(fused)                           (layer 0 without its input norm, no output norm)
    "eagle3" (EAGLE-3 as the `speculators` package defines it and vLLM serves it, see `heads/eagle_speculators.py`):
        g_t = fc([hidden_states[l]_t for l in feature_layers])   (n H -> H, no bias; not the final state)
        x = cat(input_layernorm(embed(x_{t+1})), hidden_norm(h))  (2 H: layer 0's q/k/v read both)
        s_{t+1} = layer 0 with that attention input and residual h (then post-attention norm and MLP as usual)
        logits = lm_head(norm(s_{t+1}))                          (the head's OWN LM head over its draft vocabulary)
    where h is g_t for a real position and the head's own previous s (pre-norm, H wide, no fc) for a drafted one.
    The format's optional norms (EAGLE 3.1, speculators' training default): `norm_before_fc` applies one norm
    (`input_norm`, n H wide) to fc's input, `fc_norm` one norm per layer's slot (`fc_norm.i`), and `norm_output` makes
    s_{t+1} post-norm: the head returns norm(s), scores lm_head(norm(s)) and feeds norm(s) back.

The feature h_t is the base's final (post-norm) hidden state, or, with `EagleConfig.feature_layers` (EAGLE-3's
multi-layer features, kept in ascending order as vLLM concatenates them), a fusion of several of the base's layers:
the base hands the head [final; hidden_states[l] for l in feature_layers] ((1 + n) H wide,
`TargetModel.set_feature_layers`), each slot
RMS-normed, and `feature_fc` ((1 + n) H -> H) makes h_t of them. The head's own predicted features (H wide) are fed
back as they are, so `forward` takes either width: real rows are fused, predicted ones are not.

"selfspec" and "eagle1" send f_{t+1} straight to the base's LM head; "eagle3" carries its own (`draft_logits` is the
one place that knows which). The layer is the base family's own class (found through `transformers`, never copied;
"eagle3" widens layer 0's q/k/v projections to 2 H and adds its `hidden_norm`, and `_eagle3_first_layer` feeds the
layer's own submodules); the embedding is the base's, passed in at call time, so a "selfspec" head adds about 3 % of
SmolLM2's parameters. Knows the module and its own checkpoint format; other formats on disk live in
`heads/eagle_formats.py` and `heads/eagle_speculators.py`, which import this module; `heads/eagle.py` is the public
class that reads and writes all of them. The drafter (`selfspec/drafters/eagle.py`) runs it with its own KV cache.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import sys
from dataclasses import asdict, dataclass

import torch
from torch import nn

from heads.checkpoint import BaseIdentity, attach, lm_head_weight, load_weights, read_config, save_checkpoint
from selfspec.loading import portable_name
from selfspec.hf_compat import cache_arg

FORMAT_NAME = "selfspec-eagle"
LAYOUTS = ("selfspec", "eagle1", "eagle3")
EAGLE3_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")  # EagleConfig's, the format's names


def is_eagle_config(raw: dict) -> bool:
    """Whether a heads directory's config.json describes an EAGLE head (selfspec's format or its kind)."""
    return raw.get("format") == FORMAT_NAME or raw.get("kind") == "eagle"


@dataclass(frozen=True)
class EagleConfig:
    base: BaseIdentity
    # The config its decoder layers are built from (`to_dict()` with model_type): the base's text config, or for a
    # published head its own config.json. Rebuilds the layer class without the base.
    base_config: dict
    num_layers: int = 1
    draft_vocab_size: int = 0  # 0: the full vocabulary; N > 0: a `draft_vocab` buffer of N ids is stored
    layout: str = "selfspec"  # "selfspec" (input and output norms), "eagle1" (published EAGLE-1/2, vLLM), "eagle3"
    fuse_bias: bool = False  # the fusion has a bias: only published EAGLE-1 heads trained with one (vLLM has none)
    # The base's hidden_states indices fused with its final state (EAGLE-3); () reads the final state only. The
    # "eagle3" layout fuses these layers only (the final state the target hands over too is not read). Stored
    # ascending whatever order they are given in: vLLM concatenates the auxiliary states in that order.
    feature_layers: tuple[int, ...] = ()
    # "eagle3" only, the speculators format's flags of these names: layer 0's residual is hidden_norm(h) instead of h;
    # one norm over fc's whole input; one norm per feature layer's slot; the head returns (and feeds back) norm(s)
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown EAGLE head layout {self.layout!r}; choose one of {LAYOUTS}")
        if self.fuse_bias and self.layout != "eagle1":
            raise ValueError("only the 'eagle1' layout has a fusion bias")
        # ascending, from a JSON list too
        object.__setattr__(self, "feature_layers", tuple(sorted(int(l) for l in self.feature_layers)))
        if self.base_config.get("_name_or_path"):  # where transformers loaded the base from: shipped in config.json
            gguf_file = (self.base_config.get("quantization_config") or {}).get("gguf_file")
            object.__setattr__(self, "base_config", {**self.base_config, "_name_or_path": portable_name(
                self.base_config["_name_or_path"], gguf_file)})
        if self.feature_layers and self.layout == "eagle1":
            raise ValueError("feature_layers (multi-layer features) need the 'selfspec' or 'eagle3' layout")
        if self.layout == "eagle3" and not self.feature_layers:
            raise ValueError("the 'eagle3' layout fuses the base's feature layers: give feature_layers (e.g. 'auto')")
        flags = [f for f in EAGLE3_FLAGS if getattr(self, f)]
        if flags and self.layout != "eagle3":
            raise ValueError(f"{', '.join(flags)}: flags of the 'eagle3' layout")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc (one norm over fc's input) and fc_norm (one per slot) exclude each other")
        if any(l < 0 for l in self.feature_layers) or len(set(self.feature_layers)) != len(self.feature_layers):
            raise ValueError(f"feature_layers must be distinct hidden_states indices >= 0, got {self.feature_layers}")

    @property
    def feature_width(self) -> int:
        """Width of the base's real feature rows the head reads: H, or (1 + len(feature_layers)) H."""
        return self.base.hidden_size * (1 + len(self.feature_layers))


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers of a base with `num_layers` decoder layers, as hidden_states indices
    (the input of that decoder layer): 2, num_layers // 2, num_layers - 3, as SafeAILab/EAGLE's EAGLE-3 base model
    collects them and vLLM's `eagle_aux_hidden_state_layer_ids` default. SmolLM2-135M (30 layers): (2, 15, 27). Three
    distinct layers need a base of 7 layers or more; smaller bases get the distinct ones of those, clamped to
    1 .. num_layers - 1 (6 layers: (2, 3); 5: (2,)), which vLLM's EAGLE-3 model (fc over 3 layers) cannot serve."""
    if num_layers < 2:
        raise ValueError(f"multi-layer features need a base of at least 2 layers, this one has {num_layers}")
    picked = (2, num_layers // 2, num_layers - 3)
    return tuple(sorted({min(max(l, 1), num_layers - 1) for l in picked}))


def layer_config(base_config, num_layers: int):
    """A copy of the base's text config describing `num_layers` decoder layers, sdpa attention."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(base_config, dict):
        raw = dict(base_config)
        config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    else:
        config = copy.deepcopy(base_config.get_text_config(decoder=True) if isinstance(base_config, PretrainedConfig) else base_config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:num_layers]
    config._attn_implementation = "sdpa"
    config.use_cache = True
    return config


def layer_classes(config, model=None) -> tuple[type, type | None]:
    """(decoder layer class, rotary embedding class or None) of the base's family: taken from the model when given,
    else from `transformers`' registry (the base model class's `_no_split_modules` names its layer)."""
    if model is not None:
        decoder = model.get_decoder()
        layers = getattr(decoder, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            rotary = getattr(decoder, "rotary_emb", None)
            return type(layers[0]), type(rotary) if rotary is not None else None
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        base_class = MODEL_MAPPING[type(config)]
    except KeyError as err:
        raise NotImplementedError(f"no transformers model class for {type(config).__name__}") from err
    module = sys.modules[base_class.__module__]
    names = [n for n in getattr(base_class, "_no_split_modules", None) or [] if n.endswith("DecoderLayer")]
    if not names or not hasattr(module, names[0]):
        raise NotImplementedError(
            f"cannot find the decoder layer class of {base_class.__name__}: EAGLE heads support Llama-style decoders "
            "(Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3); use drafter='medusa' or 'ngram' for others"
        )
    prefix = names[0][: -len("DecoderLayer")]
    rotary = getattr(module, f"{prefix}RotaryEmbedding", None)
    return getattr(module, names[0]), rotary


class EagleModule(nn.Module):
    def __init__(self, config: EagleConfig, model=None):
        super().__init__()
        self.config = config
        hidden = config.base.hidden_size
        self.layer_config = layer_config(config.base_config, config.num_layers)
        layer_class, rotary_class = layer_classes(self.layer_config, model)
        eps = getattr(self.layer_config, "rms_norm_eps", None) or getattr(self.layer_config, "layer_norm_epsilon", 1e-6)
        # (modules are built in the order that fixes their random initialisation for a given seed: keep it)
        def make_layers():
            return nn.ModuleList(layer_class(self.layer_config, layer_idx=i) for i in range(config.num_layers))

        if config.layout == "eagle3":
            # the named layers' states -> h (no norms, no bias); layer 0 reads [embedding; h]; its own LM head
            self.layers = make_layers()
            self.feature_fc = nn.Linear(len(config.feature_layers) * hidden, hidden, bias=False)
            _widen_first_layer(self.layers[0])
            self.norm = _norm_like(self.layers[0])
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size or config.base.vocab_size, bias=False)
            if config.norm_before_fc:  # one norm over fc's whole input [n H] (the format's `input_norm`)
                self.input_norm = _norm_like(self.layers[0], len(config.feature_layers) * hidden)
            if config.fc_norm:  # one norm per feature layer's slot (the format's `fc_norm.i`)
                self.fc_norm = nn.ModuleList(_norm_like(self.layers[0]) for _ in config.feature_layers)
        else:
            published = config.layout == "eagle1"
            # Identity norms hold no weights, so each layout's state dict names exactly what it has.
            self.feature_norm = nn.Identity() if published else nn.RMSNorm(hidden, eps=eps)
            self.embedding_norm = nn.Identity() if published else nn.RMSNorm(hidden, eps=eps)
            self.fuse = nn.Linear(2 * hidden, hidden, bias=config.fuse_bias)
            if config.feature_layers:  # EAGLE-3 features: the final state and the named layers' states -> one feature
                slots = 1 + len(config.feature_layers)
                self.slot_norms = nn.ModuleList(nn.RMSNorm(hidden, eps=eps) for _ in range(slots))
                self.feature_fc = nn.Linear(slots * hidden, hidden, bias=False)
            self.layers = make_layers()
            if published:
                _drop_input_norm(self.layers[0])
            self.norm = nn.Identity() if published else nn.RMSNorm(hidden, eps=eps)
        self.rotary_emb = rotary_class(self.layer_config) if rotary_class is not None else None
        if config.draft_vocab_size:
            self.register_buffer("draft_vocab", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        else:
            self.draft_vocab = None

    @classmethod
    def for_model(
        cls, model, num_layers: int = 1, draft_vocab: torch.Tensor | None = None, layout: str = "selfspec",
        feature_layers: tuple[int, ...] | str = (),
    ):
        """A fresh head for `model` on its device and dtype; the fusion starts as "take the feature" (W = [I, 0], or
        [0, I] in the "eagle1" layout, whose concatenation puts the embedding first), so an untrained head already
        guesses what a Medusa head at the identity would. layout="eagle1" trains a head vLLM can serve.
        feature_layers: the base's hidden_states indices to fuse with its final state (EAGLE-3), "auto" for
        `default_feature_layers`; `feature_fc` starts as "take the final state". layout="eagle3" (the speculators
        format, needs feature_layers) starts as `start_from_base` says, its draft vocabulary sorted ascending."""
        text_config = model.config.get_text_config(decoder=True)
        raw = text_config.to_dict()
        raw["model_type"] = text_config.model_type
        if feature_layers == "auto":
            feature_layers = default_feature_layers(text_config.num_hidden_layers)
        if layout == "eagle3" and draft_vocab is not None:
            draft_vocab = draft_vocab.sort().values  # ascending ids, as the speculators format's d2t / t2d hold them
        config = EagleConfig(BaseIdentity.of(model), raw, num_layers, 0 if draft_vocab is None else len(draft_vocab),
                             layout=layout, feature_layers=tuple(feature_layers))
        check_feature_layers(config.feature_layers, text_config.num_hidden_layers, "the new EAGLE head")
        head = cls(config, model)
        if layout == "eagle3":
            head.start_from_base(model, draft_vocab)
            return attach(head, model, config.base, "the EAGLE head").train()
        head.take_final_state()
        with torch.no_grad():
            hidden = config.base.hidden_size
            head.fuse.weight.zero_()
            feature_columns = slice(hidden, 2 * hidden) if layout == "eagle1" else slice(0, hidden)
            head.fuse.weight[:, feature_columns].copy_(torch.eye(hidden))
            for layer in head.layers:  # zero the residual branches' outputs: the fresh layer is the identity
                for linear in _output_projections(layer):
                    linear.weight.zero_()
            base_norm = getattr(model.get_decoder(), "norm", None) if layout == "selfspec" else None
            weight = getattr(base_norm, "weight", None)
            if weight is not None and weight.shape == head.norm.weight.shape:
                # The base's features carry its final norm's weight w. Undo it on the way in and apply it on the way
                # out, so a fresh head maps a feature to (about) itself instead of scaling it by w twice (which made
                # SmolLM2's initial logits wildly over-confident: a loss of 36 nats).
                safe = torch.where(weight.abs() < 0.05, torch.where(weight < 0, -0.05, 0.05).to(weight), weight)
                head.feature_norm.weight.copy_(1.0 / safe)
                head.norm.weight.copy_(weight)
            if draft_vocab is not None:
                head.draft_vocab.copy_(draft_vocab)
        return attach(head, model, config.base, "the EAGLE head").train()

    @torch.no_grad()
    def start_from_base(self, model, draft_vocab: torch.Tensor | None) -> None:
        """A fresh "eagle3" head: fc takes the last feature layer's state, the layers are the identity (their output
        projections zero), and norm and lm_head are the base's final norm and LM head rows (of the draft vocabulary),
        so it first guesses what the base's LM head makes of its layer `feature_layers[-1]`."""
        hidden = self.config.base.hidden_size
        self.feature_fc.weight.zero_()
        self.feature_fc.weight[:, -hidden:].copy_(torch.eye(hidden))
        for layer in self.layers:
            for linear in _output_projections(layer):
                linear.weight.zero_()
        base_norm = getattr(model.get_decoder(), "norm", None)
        if type(base_norm) is type(self.norm) and base_norm.weight.shape == self.norm.weight.shape:
            self.norm.weight.copy_(base_norm.weight)
        self.lm_head.weight.copy_(lm_head_weight(model, draft_vocab))  # [N, hidden] (a quantized head's, dequantized)
        if draft_vocab is not None:
            self.draft_vocab.copy_(draft_vocab)

    @property
    def own_lm_head(self) -> bool:
        """Whether the head scores its states with its own LM head ("eagle3") instead of the base's."""
        return self.config.layout == "eagle3"

    def draft_logits(self, states: torch.Tensor, target, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[..., H] states this head returned -> [..., N] draft logits over `vocab_ids` ([N] ids; None: the whole
        vocabulary). "selfspec" and "eagle1" heads go through the base's LM head (`target.logits`), so any rows will
        do; an "eagle3" head through its own norm and LM head, which hold its draft vocabulary's rows only."""
        if not self.own_lm_head:
            return target.logits(states, vocab_ids=vocab_ids)
        rows = self.lm_head.weight.shape[0]
        if (vocab_ids is None) != (self.draft_vocab is None) or (vocab_ids is not None and vocab_ids.shape[0] != rows):
            raise ValueError(f"an 'eagle3' EAGLE head scores its own draft vocabulary ({rows} tokens) only: pass "
                             "vocab_ids=head.draft_vocab")
        return self.lm_head(states if self.config.norm_output else self.norm(states))  # (norm_output: normed already)

    @classmethod
    def widened(cls, head, feature_layers: tuple[int, ...] | str, model):
        """A multi-layer copy of a final-state `head` (warm start): its fusion, layers and norms as they are, and
        `feature_fc` taking the final state, so it drafts exactly as `head` does until trained."""
        if head.config.feature_layers:
            raise ValueError(f"the head to widen already reads feature layers {head.config.feature_layers}")
        if head.config.layout != "selfspec":
            raise ValueError("only a 'selfspec'-layout EAGLE head can be widened to multi-layer features")
        num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
        if feature_layers == "auto":
            feature_layers = default_feature_layers(num_layers)
        check_feature_layers(tuple(feature_layers), num_layers, "the widened EAGLE head")
        config = dataclasses.replace(head.config, feature_layers=tuple(feature_layers))
        wide = cls(config, model).to(head.fuse.weight.device, head.fuse.weight.dtype)
        missing, unexpected = wide.load_state_dict(head.state_dict(), strict=False)
        if unexpected or any(not k.startswith(("slot_norms.", "feature_fc.")) for k in missing):
            raise RuntimeError(f"cannot widen this EAGLE head: missing {missing}, unexpected {unexpected}")
        wide.take_final_state()
        return wide.train(head.training)

    @torch.no_grad()
    def sort_feature_slots(self, stored: tuple[int, ...]) -> None:
        """Weights written for the feature layers in the order `stored` (a head trained on `27 15 2`) -> the same
        function with its slots in `config.feature_layers`' ascending order: feature_fc's column blocks and the
        per-slot norms (the "selfspec" layout's slot 0, the final state, stays first) move with their layers."""
        if list(stored) == list(self.config.feature_layers):
            return
        hidden, order = self.config.base.hidden_size, sorted(range(len(stored)), key=stored.__getitem__)
        slots = order if self.config.layout == "eagle3" else [0] + [1 + i for i in order]
        columns = torch.cat([torch.arange(i * hidden, (i + 1) * hidden) for i in slots])
        self.feature_fc.weight.copy_(self.feature_fc.weight[:, columns.to(self.feature_fc.weight.device)])
        per_slot = self.slot_norms if self.config.layout == "selfspec" else (self.fc_norm if self.config.fc_norm
                                                                             else None)
        if per_slot is not None:
            weights = [norm.weight.clone() for norm in per_slot]
            for norm, i in zip(per_slot, slots):
                norm.weight.copy_(weights[i])
        if self.config.norm_before_fc:
            self.input_norm.weight.copy_(self.input_norm.weight[columns.to(self.input_norm.weight.device)])

    def take_final_state(self) -> None:
        """Set `feature_fc` to pass the (normed) final-state slot through and ignore the layers' slots."""
        if not self.config.feature_layers:
            return
        hidden = self.config.base.hidden_size
        with torch.no_grad():
            self.feature_fc.weight.zero_()
            self.feature_fc.weight[:, :hidden].copy_(torch.eye(hidden))
            for norm in self.slot_norms:
                norm.weight.fill_(1.0)

    def fuse_layers(self, features: torch.Tensor) -> torch.Tensor:
        """[..., (1 + n) H] the base's final state and feature layers' states -> [..., H] the head's feature ("eagle3":
        of the feature layers' states only)."""
        if self.config.layout == "eagle3":
            layers = features[..., self.config.base.hidden_size :]  # [..., n H]
            if self.config.norm_before_fc:
                layers = self.input_norm(layers)
            if self.config.fc_norm:
                slots = layers.split(self.config.base.hidden_size, dim=-1)
                layers = torch.cat([norm(s) for norm, s in zip(self.fc_norm, slots)], dim=-1)
            return self.feature_fc(layers)
        slots = features.split(self.config.base.hidden_size, dim=-1)
        return self.feature_fc(torch.cat([norm(s) for norm, s in zip(self.slot_norms, slots)], dim=-1))

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self):
        """The head's own KV cache (one entry per position it has read), rolled back by length like the main one."""
        from transformers import DynamicCache

        return DynamicCache(config=self.layer_config)

    def forward(
        self, features: torch.Tensor, next_embeddings: torch.Tensor, position_ids: torch.Tensor, cache=None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """features [B, T, H] (h_t; with feature layers also the base's real rows [B, T, (1 + n) H], fused here),
        next_embeddings [B, T, H] (embed(x_{t+1})), position_ids [B, T] (t) ->
        [B, T, H] the predicted states for positions t+1, which `draft_logits` scores and the next draft reads back:
        post-norm features (what the base's LM head reads) in the "selfspec" and "eagle1" layouts, the layers'
        pre-norm output in "eagle3" (post-norm with its `norm_output`). With `cache`, the T positions follow its
        contents.
        attention_mask: None (causal), or a 4D additive float mask [B, 1, T, cached + T] used as given (a tree of
        drafts: each row attends to the cached entries of its own path only)."""
        from transformers.masking_utils import create_causal_mask

        hidden = self.config.base.hidden_size
        if features.shape[-1] != hidden:
            if features.shape[-1] != self.config.feature_width or not self.config.feature_layers:
                raise ValueError(
                    f"the EAGLE head reads features of width {hidden} (its own predictions) or "
                    f"{self.config.feature_width} (the base's final state and layers {self.config.feature_layers}), "
                    f"got {features.shape[-1]}: set the target's feature layers to the head's "
                    "(TargetModel.set_feature_layers(head.config.feature_layers))"
                )
            features = self.fuse_layers(features)
        eagle3 = self.config.layout == "eagle3"
        if eagle3:  # the embedding joins inside layer 0
            fused = features
        elif self.config.layout == "eagle1":  # published order: embedding first, neither normed
            fused = self.fuse(torch.cat([next_embeddings, features], dim=-1))
        else:
            fused = self.fuse(torch.cat([self.feature_norm(features), self.embedding_norm(next_embeddings)], dim=-1))
        extra = {}
        if self.rotary_emb is not None:
            extra["position_embeddings"] = self.rotary_emb(fused, position_ids)
        mask = create_causal_mask(
            config=self.layer_config, inputs_embeds=fused, attention_mask=attention_mask, **cache_arg(cache),
            position_ids=position_ids,
        )
        hidden = fused
        for i, layer in enumerate(self.layers):
            if eagle3 and i == 0:
                hidden = _eagle3_first_layer(layer, next_embeddings, hidden, self.config.norm_before_residual,
                                             attention_mask=mask, position_ids=position_ids, cache=cache,
                                             use_cache=cache is not None, **extra)
            else:
                hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, **cache_arg(cache),
                               use_cache=cache is not None, **extra)
        return hidden if eagle3 and not self.config.norm_output else self.norm(hidden)

    def check_base(self, model, what: str = "this EAGLE head", check_identity: bool = True) -> None:
        self.config.base.check_matches(BaseIdentity.of(model), what, check_identity)
        check_feature_layers(self.config.feature_layers, model.config.get_text_config(decoder=True).num_hidden_layers,
                             what)

    def save_native(self, directory: str | os.PathLike) -> None:
        """config.json (format "selfspec-eagle") + model.safetensors."""
        save_checkpoint(self, directory, {**asdict(self.config), "format": FORMAT_NAME, "kind": "eagle"})

    @classmethod
    def load_native(cls, directory: str | os.PathLike, raw: dict, model=None, check_base: bool = True):
        stored = tuple(int(l) for l in raw.get("feature_layers", ()))  # in the order its weights were written
        config = EagleConfig(BaseIdentity.from_dict(raw["base"]), raw["base_config"], raw["num_layers"],
                             raw.get("draft_vocab_size", 0), raw.get("layout", "selfspec"), raw.get("fuse_bias", False),
                             stored, **{flag: bool(raw.get(flag, False)) for flag in EAGLE3_FLAGS})
        head = load_weights(cls(config, model), directory)
        head.sort_feature_slots(stored)
        if model is not None:
            head = attach(head, model, config.base, f"the EAGLE head in {directory!r}", check_identity=check_base)
            head.check_base(model, f"the EAGLE head in {directory!r}", check_identity=False)
        return head.eval()


def check_feature_layers(feature_layers: tuple[int, ...], num_layers: int, what: str) -> None:
    """Feature layers are hidden_states indices of the base's decoder layers' inputs: 0 (the embedding) .. L - 1."""
    beyond = [l for l in feature_layers if not 0 <= l < num_layers]
    if beyond:
        raise ValueError(
            f"{what} reads the base's layers {feature_layers}, but this base has {num_layers} decoder layers "
            f"(hidden_states indices 0..{num_layers - 1}): {beyond} lie beyond it. Use the base the head was made for, "
            "or train one for this base (`python -m training.heads --kind eagle --feature-layers auto`)"
        )


def _drop_input_norm(layer: nn.Module) -> None:
    """EAGLE-1's first layer reads the fusion's output unnormed: its input norm becomes the identity (as in vLLM)."""
    if not isinstance(getattr(layer, "input_layernorm", None), nn.Module):
        raise NotImplementedError(
            f"{type(layer).__name__} has no `input_layernorm` to drop: the 'eagle1' layout supports Llama-style layers"
        )
    layer.input_layernorm = nn.Identity()


# What a layer must hold for the "eagle3" layout to feed its submodules (`_eagle3_first_layer`): a Llama-style layer
_EAGLE3_LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}


def _widen_first_layer(layer: nn.Module) -> None:
    """EAGLE-3's layer 0: q/k/v projections reading [embedding; hidden] (2 H, fresh weights of the layer's shapes and
    biases) and a `hidden_norm` of the layer's own norm class beside its input norm."""
    parts = {name for name, _ in layer.named_children()}
    attention = getattr(layer, "self_attn", None)
    projections = {n: getattr(attention, n, None) for n in ("q_proj", "k_proj", "v_proj")}
    if parts != _EAGLE3_LAYER_PARTS or not all(isinstance(p, nn.Linear) for p in projections.values()):
        raise NotImplementedError(
            f"{type(layer).__name__} is not a Llama-style layer (self_attn with q/k/v_proj, mlp, input_layernorm, "
            f"post_attention_layernorm; it has {sorted(parts)}): the 'eagle3' layout cannot widen its attention. Use "
            "the 'selfspec' layout with --feature-layers for this base"
        )
    for name, linear in projections.items():
        setattr(attention, name, nn.Linear(2 * linear.in_features, linear.out_features, bias=linear.bias is not None))
    layer.hidden_norm = _norm_like(layer)


def _norm_like(layer: nn.Module, width: int | None = None) -> nn.Module:
    """A norm of the layer's input norm's class and epsilon: a copy of a freshly built layer's, at its initial weight
    (called while the head is being built, before any weights are loaded); `width` other than the layer's: a fresh one
    of that class (RMSNorm-style classes take (hidden_size, eps))."""
    norm = layer.input_layernorm
    if width is None:
        return copy.deepcopy(norm)
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    return type(norm)(width, eps=eps)


def _eagle3_first_layer(layer: nn.Module, embeddings: torch.Tensor, hidden: torch.Tensor, norm_before_residual: bool,
                        attention_mask, position_ids, cache, use_cache, **extra) -> torch.Tensor:
    """EAGLE-3's layer 0 on the layer's own submodules: attention over cat(input_layernorm(embedding),
    hidden_norm(hidden)) [.., 2 H], residual `hidden` (or its norm), then the layer's post-attention norm and MLP."""
    normed = layer.hidden_norm(hidden)
    residual = normed if norm_before_residual else hidden
    attended, _ = layer.self_attn(
        hidden_states=torch.cat([layer.input_layernorm(embeddings), normed], dim=-1), attention_mask=attention_mask,
        position_ids=position_ids, **cache_arg(cache), use_cache=use_cache, **extra,
    )
    hidden = residual + attended
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def _output_projections(layer: nn.Module) -> list[nn.Linear]:
    """The linear layers that write into a decoder layer's residual stream (attention out, MLP down)."""
    names = ("o_proj", "down_proj", "dense", "c_proj", "out_proj", "fc2")
    return [m for n, m in layer.named_modules() if n.rsplit(".", 1)[-1] in names and isinstance(m, nn.Linear)]
