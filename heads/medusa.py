"""Medusa heads: K small residual blocks on the base model's last hidden state at position t; head k (0-based)
guesses token t+2+k (the base itself predicts t+1).

Knows the head architecture, its initialisation and its own safetensors checkpoint format (with the identity
of the base it was built for). Knows nothing about decoding; published Medusa and vLLM formats live in
`heads/formats.py`.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_NAME = "selfspec-medusa"
_SIGNATURE_SIZE = 16  # sampled LM-head weights recorded to recognise the base across dtypes and paths


@dataclass(frozen=True)
class BaseIdentity:
    """What heads remember of the model they were built for, so a mismatch fails at load, not as garbage."""

    hidden_size: int
    vocab_size: int
    name_or_path: str = ""
    model_type: str = ""
    # A few LM-head weights at fixed positions: survives moving the checkpoint or changing the dtype,
    # differs between two trainings of the same architecture. Empty when unknown (published Medusa heads).
    signature: tuple[float, ...] = field(default=())

    @classmethod
    def from_dict(cls, raw: dict) -> "BaseIdentity":
        """The identity as a checkpoint's config.json records it (JSON turns the signature into a list)."""
        return cls(**{**raw, "signature": tuple(raw.get("signature", ()))})

    @classmethod
    def of(cls, model) -> "BaseIdentity":
        config = model.config
        return cls(
            hidden_size=config.hidden_size,
            vocab_size=model.get_output_embeddings().weight.shape[0],
            name_or_path=str(getattr(config, "_name_or_path", "") or ""),
            model_type=str(getattr(config, "model_type", "")),
            signature=lm_head_signature(model),
        )

    def check_matches(self, base: "BaseIdentity", what: str = "these heads", check_identity: bool = True) -> None:
        """Raise a ValueError saying what differs and how to fix it. Shapes are always checked (no override can
        make them fit); check_identity=False skips only the LM-head signature (same shapes, another training)."""
        fix = "Load heads trained for this model, or train new ones with `python -m training.heads --model ...`."
        if self.hidden_size != base.hidden_size:
            raise ValueError(
                f"{what} expect hidden size {self.hidden_size} but the model has {base.hidden_size}. {fix}"
            )
        if self.vocab_size != base.vocab_size:
            raise ValueError(
                f"{what} expect a vocabulary of {self.vocab_size} tokens but the model has {base.vocab_size}. {fix}"
            )
        if check_identity and self.signature and base.signature:
            ours, theirs = torch.tensor(self.signature), torch.tensor(base.signature)
            if not torch.allclose(ours, theirs, rtol=2e-2, atol=2e-3):
                raise ValueError(
                    f"{what} were built for a different base model ({self.name_or_path or 'unnamed'}, "
                    f"{self.model_type}): its LM-head weights differ from this model's "
                    f"({base.name_or_path or 'unnamed'}). {fix} To force it anyway pass check_base=False."
                )


def load_state_in_its_dtype(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """load_state_dict without a detour through the module's construction dtype (float32), which would round
    float64 weights; the caller moves the module to a model's dtype afterwards if it wants another."""
    dtypes = {v.dtype for v in state.values()}
    if len(dtypes) == 1:
        module.to(dtypes.pop())
    module.load_state_dict(state)


def lm_head_signature(model) -> tuple[float, ...]:
    weight = model.get_output_embeddings().weight.detach()
    rows = torch.linspace(0, weight.shape[0] - 1, _SIGNATURE_SIZE).long()
    cols = torch.linspace(0, weight.shape[1] - 1, _SIGNATURE_SIZE).long().flip(0)
    return tuple(round(float(v), 6) for v in weight[rows.to(weight.device), cols.to(weight.device)].float())


def read_config(directory: str | os.PathLike, what: str) -> dict:
    """A checkpoint directory's config.json, or a FileNotFoundError saying the directory is not `what`."""
    config_path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"no {CONFIG_NAME} in {directory!r}: not {what}")
    with open(config_path) as f:
        return json.load(f)


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int  # residual blocks per head
    share_lm_head: bool  # True: every head projects through the base LM head (no extra vocabulary matrices)
    base: BaseIdentity


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W zero-initialised so a fresh block is the identity (as Medusa initialises it)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


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

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    @classmethod
    def for_model(cls, model, num_heads: int = 4, num_layers: int = 1, share_lm_head: bool = True) -> "MedusaHeads":
        """Fresh heads sized for `model`, on its device and dtype; own LM projections start as copies of the base's."""
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"num_heads and num_layers must be >= 1, got {num_heads} and {num_layers}")
        heads = cls(MedusaConfig(num_heads, num_layers, share_lm_head, BaseIdentity.of(model)))
        base_lm_head = model.get_output_embeddings()
        if heads.lm_heads is not None:
            for lm_head in heads.lm_heads:
                lm_head.weight.data.copy_(base_lm_head.weight.data)
        return heads.to(device=base_lm_head.weight.device, dtype=base_lm_head.weight.dtype)

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
        (which, with a shared LM head, needs the base `model` to copy its LM head into the file)."""
        if format == "vllm":
            from heads.formats import save_vllm

            return save_vllm(self, directory, model=model)
        if format != "selfspec":
            raise ValueError(f"unknown heads format {format!r}; choose 'selfspec' or 'vllm'")
        os.makedirs(directory, exist_ok=True)
        config = asdict(self.config)
        config["format"] = FORMAT_NAME
        with open(os.path.join(directory, CONFIG_NAME), "w") as f:
            json.dump(config, f, indent=2)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, model=None, check_base: bool = True) -> "MedusaHeads":
        """Load heads saved by `save_pretrained` (or published Medusa heads, or a vLLM export); with `model`, check
        they fit it and move them to its device and dtype."""
        raw = read_config(directory, "a heads directory")
        if raw.get("format") != FORMAT_NAME:
            from heads.formats import load_published_medusa

            heads = load_published_medusa(directory, raw, model)
        else:
            base = BaseIdentity.from_dict(raw["base"])
            heads = cls(MedusaConfig(raw["num_heads"], raw["num_layers"], raw["share_lm_head"], base))
            load_state_in_its_dtype(heads, load_file(os.path.join(directory, WEIGHTS_NAME)))
        if model is not None:
            heads.check_base(model, f"the heads in {directory!r}", check_identity=check_base)
            weight = model.get_output_embeddings().weight
            heads = heads.to(device=weight.device, dtype=weight.dtype)
        return heads
