"""Exit adapter: a small residual block that maps the exit layer's hidden state towards the last layer's.

Early exit reads a draft off layer L as lm_head(final_norm(adapter(h_L))). A fresh adapter is the identity
(plain early exit); `python -m training.heads --kind exit-adapter` trains it to match the full model's
distribution. Knows the module and its checkpoint; the early-exit drafter applies it.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from heads.medusa import CONFIG_NAME, WEIGHTS_NAME, BaseIdentity, ResBlock, read_config, load_state_in_its_dtype

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
        adapter = cls(ExitAdapterConfig(exit_layer, num_layers, BaseIdentity.of(model)))
        weight = model.get_output_embeddings().weight
        return adapter.to(device=weight.device, dtype=weight.dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] exit-layer output (before the final norm) -> [..., hidden], still before the final norm."""
        return self.blocks(hidden)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, CONFIG_NAME), "w") as f:
            json.dump({**asdict(self.config), "format": FORMAT_NAME}, f, indent=2)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, model=None, check_base: bool = True) -> "ExitAdapter":
        raw = read_config(directory, "an exit-adapter directory")
        if raw.get("format") != FORMAT_NAME:
            raise ValueError(f"{directory!r} holds {raw.get('format', 'something else')!r}, not an exit adapter")
        base = BaseIdentity.from_dict(raw["base"])
        adapter = cls(ExitAdapterConfig(raw["exit_layer"], raw["num_layers"], base))
        load_state_in_its_dtype(adapter, load_file(os.path.join(directory, WEIGHTS_NAME)))
        if model is not None:
            base.check_matches(BaseIdentity.of(model), f"the exit adapter in {directory!r}", check_identity=check_base)
            weight = model.get_output_embeddings().weight
            adapter = adapter.to(device=weight.device, dtype=weight.dtype)
        return adapter
