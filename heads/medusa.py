"""Medusa heads: K small residual blocks on the base model's last hidden state at position t; head k (0-based)
guesses token t+2+k (the base itself predicts t+1).

Knows the head architecture, its initialisation and its own safetensors checkpoint format (with the identity
of the base it was built for). Knows nothing about decoding; published Medusa and vLLM formats live in
`heads/formats.py`.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import nn

from heads.blocks import ResBlock  # noqa: F401  (re-exported)
from heads.checkpoint import (  # noqa: F401  (BaseIdentity and read_config re-exported for older imports)
    CONFIG_NAME, WEIGHTS_NAME, BaseIdentity, attach, lm_head_dtype, lm_head_weight, load_weights, read_config,
    save_checkpoint,
)

FORMAT_NAME = "selfspec-medusa"


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int  # residual blocks per head
    share_lm_head: bool  # True: every head projects through the base LM head (no extra vocabulary matrices)
    base: BaseIdentity
    draft_vocab_size: int = 0  # 0: the full vocabulary; N > 0: a `draft_vocab` buffer of N ids (heads/draft_vocab.py)


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        hidden, vocab = config.base.hidden_size, config.base.vocab_size
        # One ModuleList per head; a list comprehension builds distinct modules (never `[Module()] * n`).
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden) for _ in range(config.num_layers)]) for _ in range(config.num_heads)
        )
        self.lm_heads = (
            None
            if config.share_lm_head
            else nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in range(config.num_heads))
        )
        if config.draft_vocab_size:
            self.register_buffer("draft_vocab", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        else:
            self.draft_vocab = None

    @classmethod
    def build(cls, num_heads: int, num_layers: int, share_lm_head: bool, base: BaseIdentity,
              draft_vocab_size: int = 0) -> "MedusaHeads":
        """Heads of this shape for `base`, weights as initialised (checkpoint readers fill them)."""
        return cls(MedusaConfig(num_heads, num_layers, share_lm_head, base, draft_vocab_size))

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    @classmethod
    def for_model(
        cls, model, num_heads: int = 4, num_layers: int = 1, share_lm_head: bool = True,
        draft_vocab: torch.Tensor | None = None,
    ) -> "MedusaHeads":
        """Fresh heads sized for `model`, on its device and dtype; own LM projections start as copies of the base's.
        draft_vocab [N]: the ids the heads may draft (with a shared LM head, they project onto those rows only)."""
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"num_heads and num_layers must be >= 1, got {num_heads} and {num_layers}")
        draft_vocab_size = 0 if draft_vocab is None else len(draft_vocab)
        heads = cls(MedusaConfig(num_heads, num_layers, share_lm_head, BaseIdentity.of(model), draft_vocab_size))
        if draft_vocab is not None:
            heads.draft_vocab.copy_(draft_vocab)
        if heads.lm_heads is not None:
            base_rows = lm_head_weight(model)  # [vocab, hidden] (a quantized LM head's, dequantized)
            for lm_head in heads.lm_heads:
                lm_head.weight.data.copy_(base_rows)
        return heads.to(device=model.get_output_embeddings().weight.device, dtype=lm_head_dtype(model))

    def hidden_states(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """[..., hidden] -> [..., num_heads, hidden]: each head's transformed state, before any LM projection."""
        blocks = self.blocks[: num_heads or self.num_heads]
        return torch.stack([block(hidden) for block in blocks], dim=-2)

    def forward(
        self, hidden: torch.Tensor, base_logits: Callable[[torch.Tensor], torch.Tensor], num_heads: int | None = None
    ) -> torch.Tensor:
        """[..., hidden] -> [..., num_heads, vocab] logits; head k scores the token k+1 places after the next one.

        `base_logits` maps hidden states to logits through the base LM head (and any final logit transform of
        the base, such as soft-capping); with a shared LM head all heads go through it in one matrix multiply.
        """
        states = self.hidden_states(hidden, num_heads)
        if self.lm_heads is None:
            return base_logits(states)
        return torch.stack([lm_head(states[..., i, :]) for i, lm_head in enumerate(self.lm_heads[: states.shape[-2]])], -2)

    def check_base(self, model, what: str = "these heads", check_identity: bool = True) -> None:
        self.config.base.check_matches(BaseIdentity.of(model), what, check_identity)

    # -- checkpoints -------------------------------------------------------------------------------------------

    def save_pretrained(self, directory: str | os.PathLike, format: str = "selfspec", model=None) -> None:
        """Write safetensors weights plus a config.json recording the base; format="vllm" writes vLLM's layout
        (which, with a shared LM head, needs the base `model` to copy its LM head into the file; a draft vocabulary
        goes there as vLLM's `token_map`)."""
        if format == "vllm":
            from heads.formats import save_vllm

            return save_vllm(self, directory, model=model)
        if format != "selfspec":
            raise ValueError(f"unknown heads format {format!r}; choose 'selfspec' or 'vllm'")
        save_checkpoint(self, directory, {**asdict(self.config), "format": FORMAT_NAME})

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, model=None, check_base: bool = True) -> "MedusaHeads":
        """Load heads saved by `save_pretrained` (or published Medusa heads, or a vLLM export); with `model`, check
        they fit it and move them to its device and dtype."""
        from heads.eagle import is_eagle_directory

        raw = read_config(directory, "a heads directory")
        if is_eagle_directory(directory, raw):
            raise ValueError(f"{str(directory)!r} holds an EAGLE head, not Medusa heads: load it with "
                             "EagleHead.from_pretrained; in SelfSpecModel use drafter='eagle' or leave drafter unset")
        if raw.get("format") != FORMAT_NAME:
            from heads.formats import load_published_medusa

            heads = load_published_medusa(directory, raw, model, build=cls.build)
        else:
            base = BaseIdentity.from_dict(raw["base"])
            config = MedusaConfig(raw["num_heads"], raw["num_layers"], raw["share_lm_head"], base, raw.get("draft_vocab_size", 0))
            heads = load_weights(cls(config), directory)
        if model is not None:
            heads = attach(heads, model, heads.config.base, f"the heads in {directory!r}", check_identity=check_base)
        return heads
