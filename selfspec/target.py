"""The target model as the engine sees it: token ids through the shared cache to final hidden states, then logits.

Wraps any `transformers` causal LM through its public parts (`get_decoder()`, `get_output_embeddings()`) and
checks once, at wrap time, that those parts reproduce the model's own logits. Early exit also needs the layers one
by one (`model_parts.py`, reached lazily so other drafters work on any causal LM). Knows nothing about drafts.
"""
from __future__ import annotations

import weakref

import torch

from heads.checkpoint import lm_head_dtype, lm_head_shape
from selfspec.cache import KVCache
from selfspec.llama_forward import LlamaForward
from selfspec.model_parts import ModelParts
from selfspec.hf_compat import cache_arg

# model -> what its logits check passed with (its class, decoder and LM head, final transforms, dtype, device): a model
# wrapped again (a wrapper per call, as the command line builds one) is not probed again; it was ~4 decodes of
# SmolLM2 per wrap.
_LOGITS_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# model -> (what its plain forward was built for, the LlamaForward or None): built and probed once per model.
_PLAIN_FORWARDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class TargetModel:
    def __init__(self, model):
        if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
            raise TypeError(f"{type(model).__name__} has no LM head: pass a causal LM (AutoModelForCausalLM)")
        try:
            self.decoder = model.get_decoder()
        except (AttributeError, NotImplementedError, ValueError) as err:
            raise TypeError(f"cannot reach the decoder stack of {type(model).__name__}: {err}") from err
        if self.decoder is None or self.decoder is model:
            raise TypeError(f"cannot reach the decoder stack of {type(model).__name__} (get_decoder() gave none)")
        self.model = model.eval()  # decoding never wants dropout; from_pretrained models are in eval mode already
        self.lm_head = model.get_output_embeddings()
        config = model.config
        # Final logit transforms some families apply after the LM head (Gemma 2/3 soft-capping, Cohere scale,
        # Granite scaling); `_check_logits` below proves the list covers the model at hand.
        self._softcap = getattr(config, "final_logit_softcapping", None)
        self._scale = getattr(config, "logit_scale", None)
        self._divide = getattr(config, "logits_scaling", None)
        # [vocab, hidden] from the layer where it says so (bitsandbytes' 4-bit LM head packs its weight as [n, 1]
        # bytes), and the activations' dtype (attention masks are built in it), not a packed weight's
        self.vocab_size, self.hidden_size = lm_head_shape(model)
        self.dtype = lm_head_dtype(model)
        self.max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.device = self.lm_head.weight.device
        self.num_layers = config.get_text_config(decoder=True).num_hidden_layers
        self._parts = None
        # hidden_states indices the drafter reads beside the final state (EAGLE-3): see set_feature_layers
        self.feature_layers: tuple[int, ...] = ()
        self._rows_for, self._rows = None, None  # the LM head restricted to a draft vocabulary (see logits)
        checked = (type(model), id(self.decoder), id(self.lm_head), self._softcap, self._scale, self._divide,
                   self.dtype, self.device)
        # The decoder's forward in plain ops where the model is a plain Llama (llama_forward.py), else None: the
        # decoder's own forward runs. Built before the logits check, which then checks it too.
        decoder_key = (type(model), id(self.decoder), self.dtype, self.device)
        built_for, self.plain_forward = _PLAIN_FORWARDS.get(model, (None, None))
        if built_for != decoder_key:
            self.plain_forward = LlamaForward.of(model)
            _PLAIN_FORWARDS[model] = (decoder_key, self.plain_forward)
        if _LOGITS_CHECKED.get(model) != checked:
            self._check_logits()
            _LOGITS_CHECKED[model] = checked

    @property
    def parts(self) -> ModelParts:
        """Layer-level access, built (and checked) on first use; raises NotImplementedError for unknown layouts."""
        if self._parts is None:
            self._parts = ModelParts.of(self.model)
        return self._parts

    def new_cache(self) -> KVCache:
        return KVCache(self.model)

    def set_feature_layers(self, layers: tuple[int, ...]) -> None:
        """Every decoder call then returns [..., (1 + len(layers)) * hidden] rows: the final (normed) state, then
        `hidden_states[l]` (the input of decoder layer l, before any norm) for each l; `logits` reads the first
        `hidden_size` columns. Set once, by the engine, from the drafter's `feature_layers`; () (default): final only."""
        layers = tuple(int(l) for l in layers)
        beyond = [l for l in layers if not 0 <= l < self.num_layers]
        if beyond:
            raise ValueError(f"feature layers {layers}: this model has {self.num_layers} decoder layers "
                             f"(hidden_states indices 0..{self.num_layers - 1}); {beyond} lie beyond it")
        self.feature_layers = layers

    @property
    def decoder_options(self) -> dict:
        """What every decoder call passes so that `states` can read the feature layers."""
        return {"output_hidden_states": True} if self.feature_layers else {}

    def states(self, out) -> torch.Tensor:
        """A decoder call's output -> [..., hidden] final states, or [..., (1 + n) hidden] with feature layers."""
        if not self.feature_layers:
            return out.last_hidden_state
        return torch.cat([out.last_hidden_state] + [out.hidden_states[l] for l in self.feature_layers], dim=-1)

    def decode(self, token_ids: torch.Tensor, hf_cache, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, n] ids after the cache's contents -> [B, n, hidden] final states ([B, n, (1 + f) hidden] with feature
        layers): the decoder's forward, in plain ops where `plain_forward` has it and no hook asks for the modules.
        attention_mask (4D) and position_ids [B, n] as the decoder takes them (a tree's or a batch's); None: a causal
        block after the cache."""
        if self.plain_forward is not None and not self.plain_forward.runs_modules():
            final, features = self.plain_forward(token_ids, hf_cache, attention_mask, position_ids, self.feature_layers)
            return torch.cat([final, *features], dim=-1) if features else final
        out = self.decoder(input_ids=token_ids, attention_mask=attention_mask, position_ids=position_ids,
                           **cache_arg(hf_cache), use_cache=True, **self.decoder_options)
        return self.states(out)

    def _run_layers(self, hidden: torch.Tensor, hf_cache, start: int, end: int,
                    attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Layers [start, end) of the decoder (`ModelParts.run_layers`' contract), by the plain forward where `decode`
        takes it: a drafter that runs part of the model (early exit) computes those layers as every forward does."""
        if self.plain_forward is not None and not self.plain_forward.runs_modules():
            return self.plain_forward.run_layers(hidden, hf_cache, start, end, attention_mask, position_ids)[0]
        return self.parts.run_layers(hidden, hf_cache, start, end, attention_mask, position_ids)

    def _refuse_resume_with_features(self) -> None:
        if self.feature_layers:
            raise NotImplementedError(
                f"a forward resumed after early exit's layers cannot return feature layers {self.feature_layers}: "
                "multi-layer features (an EAGLE-3 head) and early exit do not combine"
            )

    def forward(
        self, token_ids: torch.Tensor, cache: KVCache, start_layer: int = 0, start_hidden: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[num_tokens] ids appended after the cache's contents -> [num_tokens, hidden] final (normed) hidden states.

        With start_layer > 0 the first `start_layer` layers already ran over these tokens (early-exit drafting wrote
        their keys and values) and `start_hidden` [num_tokens, hidden] is their output: only the rest run.
        """
        if start_layer == 0:
            return self.decode(token_ids[None], cache.hf_cache)[0]
        self._refuse_resume_with_features()
        if start_hidden is None or start_hidden.shape[0] != token_ids.shape[0]:
            raise ValueError(f"resuming at layer {start_layer} needs the layer's output for all {token_ids.shape[0]} tokens")
        hidden = self._run_layers(start_hidden[None], cache.hf_cache, start_layer, self.num_layers)
        return self.parts.norm(hidden)[0]

    def exit_forward(self, token_ids: torch.Tensor, cache: KVCache, exit_layer: int) -> torch.Tensor:
        """[num_tokens] ids after layer 0's cached tokens -> [num_tokens, hidden] output of the first `exit_layer`
        layers (before the final norm); writes those layers' keys and values only."""
        parts = self.parts
        return self._run_layers(parts.embed(token_ids[None], cache.hf_cache), cache.hf_cache, 0, exit_layer)[0]

    def exit_forward_block(self, block_ids: torch.Tensor, hf_cache, exit_layer: int, attention_mask: torch.Tensor,
                           position_ids: torch.Tensor) -> torch.Tensor:
        """A batch's ragged rows (`RaggedCache`): [B, n] ids with their 4D mask and [B, n] positions -> [B, n, hidden]
        output of the first `exit_layer` layers (before the final norm); writes those layers' keys and values only."""
        parts = self.parts
        hidden = parts.embed(block_ids, hf_cache, position_ids)
        return self._run_layers(hidden, hf_cache, 0, exit_layer, attention_mask, position_ids)

    def forward_block_from(self, start_hidden: torch.Tensor, hf_cache, start_layer: int, attention_mask: torch.Tensor,
                           position_ids: torch.Tensor) -> torch.Tensor:
        """A batch's ragged rows whose first `start_layer` layers already ran over the block (`exit_forward_block`):
        [B, n, hidden] their output -> [B, n, hidden] final (normed) hidden states; only the remaining layers run."""
        self._refuse_resume_with_features()
        hidden = self._run_layers(start_hidden, hf_cache, start_layer, self.num_layers, attention_mask, position_ids)
        return self.parts.norm(hidden)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] a layer's output -> what the LM head reads (the decoder's final norm)."""
        return self.parts.norm(hidden)

    def logits(self, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[..., hidden] -> [..., vocab], exactly what the model's own forward returns as logits.

        vocab_ids [N] (a draft vocabulary): only those rows of the LM head, [..., N] logits (N/vocab of the cost).
        Rows wider than `hidden_size` (with feature layers) are read by their first `hidden_size` columns.
        """
        if hidden.shape[-1] != self.hidden_size:
            hidden = hidden[..., : self.hidden_size].contiguous()
        logits = self.lm_head(hidden) if vocab_ids is None else self.lm_head_rows(vocab_ids)(hidden)
        if self._scale is not None:
            logits = logits * self._scale
        if self._divide is not None:
            logits = logits / self._divide
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    def lm_head_rows(self, vocab_ids: torch.Tensor) -> torch.nn.Linear:
        """The LM head restricted to the rows `vocab_ids` (a draft vocabulary), as an nn.Linear (so the engine can
        route its few-row products through selfspec's kernel, `few_row_linear.FewRowLinears`). Kept for the last
        vocab_ids seen: slicing 8k rows of a 49k x 576 head per draft token would cost more than the projection."""
        if self._rows_for is not vocab_ids:
            if not self.lm_head.weight.dtype.is_floating_point:  # (a torchao weight indexes by rows; its dtype is float)
                raise NotImplementedError(
                    f"a draft vocabulary reads rows of the LM head, whose weight {type(self.model).__name__} stores "
                    f"packed as {self.lm_head.weight.dtype} ({type(self.lm_head).__name__}, e.g. bitsandbytes); keep "
                    "the LM head unquantized (transformers' default for bitsandbytes), or draft over the whole "
                    "vocabulary (draft_vocab='full')")
            weight = self.lm_head.weight.detach()[vocab_ids]
            bias = getattr(self.lm_head, "bias", None)
            rows = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
            rows.weight = torch.nn.Parameter(weight, requires_grad=False)
            if bias is not None:
                rows.bias = torch.nn.Parameter(bias.detach()[vocab_ids], requires_grad=False)
            self._rows_for, self._rows = vocab_ids, rows.requires_grad_(False)
        return self._rows

    @torch.no_grad()
    def _check_logits(self) -> None:
        cache = self.new_cache()  # first, so a cache that cannot roll back is named before anything else fails
        probe = torch.arange(4, device=self.device) % self.vocab_size
        expected = self.model(input_ids=probe[None]).logits[0]
        got = self.logits(self.forward(probe, cache))
        tolerance = 1e-3 if expected.dtype in (torch.float16, torch.bfloat16) else 1e-5
        scale = expected.abs().max().clamp_min(1.0)
        if got.shape != expected.shape or (got - expected).abs().max() > tolerance * scale * 10:
            raise TypeError(
                f"selfspec cannot reproduce {type(self.model).__name__}'s logits from its decoder and LM head "
                "(it applies a final transform selfspec does not know). Please open an issue naming the model."
            )
