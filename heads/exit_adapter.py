"""Exit adapter: a small residual block that maps the exit layer's hidden state towards the last layer's.

Early exit reads a draft off layer L as lm_head(final_norm(adapter(h_L))). A fresh adapter is the identity
(plain early exit); `python -m training.heads --kind exit-adapter` trains it to match the full model's
distribution. Knows the module and its checkpoint; the early-exit drafter applies it.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

from heads.blocks import ResBlock
from heads.checkpoint import BaseIdentity, attach, load_weights, place_like, read_config, save_checkpoint

FORMAT_NAME = "selfspec-exit-adapter"


@dataclass(frozen=True)
class ExitAdapterConfig:
    exit_layer: int  # the adapter reads the output of the first `exit_layer` decoder layers
    num_layers: int
    base: BaseIdentity


class ExitAdapter(nn.Module):
    def __init__(self, config: ExitAdapterConfig):
        super().__init__()
        self.config = config
        self.blocks = nn.Sequential(*[ResBlock(config.base.hidden_size) for _ in range(config.num_layers)])

    @property
    def exit_layer(self) -> int:
        return self.config.exit_layer

    @classmethod
    def for_model(cls, model, exit_layer: int, num_layers: int = 1) -> "ExitAdapter":
        num_hidden_layers = model.config.num_hidden_layers
        if not 1 <= exit_layer < num_hidden_layers:
            raise ValueError(f"exit_layer must be in [1, {num_hidden_layers - 1}] for this model, got {exit_layer}")
        return place_like(cls(ExitAdapterConfig(exit_layer, num_layers, BaseIdentity.of(model))), model).train()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] exit-layer output (before the final norm) -> [..., hidden], still before the final norm."""
        return self.blocks(hidden)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        save_checkpoint(self, directory, {**asdict(self.config), "format": FORMAT_NAME})

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, model=None, check_base: bool = True) -> "ExitAdapter":
        raw = read_config(directory, "an exit-adapter directory")
        if raw.get("format") != FORMAT_NAME:
            raise ValueError(f"{directory!r} holds {raw.get('format', 'something else')!r}, not an exit adapter")
        base = BaseIdentity.from_dict(raw["base"])
        adapter = load_weights(cls(ExitAdapterConfig(raw["exit_layer"], raw["num_layers"], base)), directory)
        if model is not None:
            adapter = attach(adapter, model, base, f"the exit adapter in {directory!r}", check_identity=check_base)
        return adapter
