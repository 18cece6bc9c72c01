"""Checkpoint identity and placement for every head kind: what base a head was built for, reading and writing its
directory (config.json + model.safetensors), and moving a head onto the model it drafts for.

The one place that checks "does this head fit this model" and "follow the model's device and dtype". Knows nothing
about any head's architecture.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, is_dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from selfspec.loading import portable_name

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
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

    def __post_init__(self):
        # a hub id or a relative name, never this machine's folder: config.json ships, and vLLM reads the verifier's
        # name from it (an identity read from an older file is shortened too, so saving it again writes the short name)
        object.__setattr__(self, "name_or_path", portable_name(self.name_or_path))

    @classmethod
    def from_dict(cls, raw: dict) -> "BaseIdentity":
        """The identity as a checkpoint's config.json records it (JSON turns the signature into a list)."""
        return cls(**{**raw, "signature": tuple(raw.get("signature", ()))})

    @classmethod
    def of(cls, model) -> "BaseIdentity":
        config = model.config
        return cls(
            hidden_size=config.hidden_size,
            vocab_size=lm_head_shape(model)[0],
            name_or_path=portable_name(getattr(config, "_name_or_path", ""),
                                       getattr(getattr(config, "quantization_config", None), "gguf_file", None)),
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
    dtypes = {v.dtype for v in state.values() if v.is_floating_point()}  # id buffers (draft_vocab) keep theirs
    if len(dtypes) == 1:
        module.to(dtypes.pop())
    module.load_state_dict(state)


def lm_head_signature(model) -> tuple[float, ...]:
    vocab, hidden = lm_head_shape(model)
    rows = torch.linspace(0, vocab - 1, _SIGNATURE_SIZE).long()
    cols = torch.linspace(0, hidden - 1, _SIGNATURE_SIZE).long().flip(0)
    picked = lm_head_weight(model, rows)  # [_SIGNATURE_SIZE, hidden] (a plain weight's: weight[rows, cols] as before)
    values = picked[torch.arange(_SIGNATURE_SIZE, device=picked.device), cols.to(picked.device)]
    return tuple(round(float(v), 6) for v in values.float())


def lm_head_shape(model) -> tuple[int, int]:
    """(vocab, hidden) of the model's LM head, from the layer where it says so: bitsandbytes' 4-bit LM head packs its
    weight as [vocab * hidden / 2, 1] bytes."""
    lm_head = model.get_output_embeddings()
    weight = lm_head.weight
    return (getattr(lm_head, "out_features", None) or weight.shape[0],
            getattr(lm_head, "in_features", None) or weight.shape[1])


def lm_head_weight(model, rows: torch.Tensor | None = None) -> torch.Tensor:
    """[len(rows), hidden] the LM head's weight rows `rows` ([n] ids; None: all [vocab, hidden]) as a plain dense
    tensor, detached. A quantized weight gives the values it stands for: a tensor subclass (torchao's Int8Tensor, a
    GGUF `QuantizedWeight`) indexes its rows, then dequantizes only those; bitsandbytes' packed int8 / 4-bit weight
    (which has no rows to index) is dequantized whole. A plain weight's values are returned as they are."""
    lm_head = model.get_output_embeddings()
    weight = lm_head.weight.detach()
    if not weight.dtype.is_floating_point:  # bitsandbytes' Int8Params / Params4bit: bytes, with their scales beside
        from transformers.integrations.bitsandbytes import dequantize_bnb_weight

        vocab, hidden = lm_head_shape(model)
        state = getattr(lm_head.weight, "quant_state", None)
        if getattr(state, "packing_format_for_cpu", False):
            weight = _bnb_cpu_packed_4bit(weight, state, vocab, hidden)
        else:
            weight = dequantize_bnb_weight(lm_head.weight, getattr(lm_head, "state", None)).detach().view(vocab, hidden)
    picked = weight if rows is None else weight[rows.to(weight.device)]
    if type(picked) is torch.Tensor:
        return picked
    if not callable(getattr(picked, "dequantize", None)):
        raise TypeError(f"the LM head's weight is a {type(picked).__name__}, which has no dequantize(): selfspec "
                        "cannot read its values (heads need them to recognise the base and to start from its rows)")
    return picked.dequantize()


def _bnb_cpu_packed_4bit(packed: torch.Tensor, state, rows: int, cols: int) -> torch.Tensor:
    """[rows, cols] float32 values of a bitsandbytes 4-bit weight in its CPU layout. On a CPU with AVX512-BF16,
    bitsandbytes (0.50) repacks a Linear4bit's weight at its first forward for its bfloat16 kernel: [rows, cols / 2]
    bytes, each group of 32 bytes holding a 32-row x 2-column tile (low nibbles the first 32 of the tile's 64 codes in
    (row, column) order, high nibbles the rest), and bfloat16 block scales stored [cols / blocksize, rows]. transformers'
    dequantizer reads that as the plain layout and returns garbage, so it is decoded here, without changing the layer."""
    tile = 32
    codes = packed.reshape(-1, tile)
    codes = torch.cat([codes & 0xF, codes >> 4], dim=-1)  # [rows / 32 * cols / 2, 64] in (row, column) order
    codes = codes.reshape(rows // tile, cols // 2, tile, 2).transpose(1, 2).reshape(rows, cols).long()
    scales = state.absmax.float().T.repeat_interleave(state.blocksize, dim=1)  # [rows, cols]
    return state.code.float().to(codes.device)[codes] * scales


def lm_head_dtype(model) -> torch.dtype:
    """The dtype of the model's activations, which heads follow: the LM head's, unless its weight is stored packed
    (bitsandbytes: int8 / uint8), then the input embedding's."""
    weight = model.get_output_embeddings().weight
    return weight.dtype if weight.dtype.is_floating_point else model.get_input_embeddings().weight.dtype


def read_config(directory: str | os.PathLike, what: str) -> dict:
    """A checkpoint directory's config.json, or a FileNotFoundError saying the directory is not `what`."""
    config_path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"no {CONFIG_NAME} in {directory!r}: not {what}")
    with open(config_path) as f:
        return json.load(f)


def place_like(module: nn.Module, model) -> nn.Module:
    """Move a head onto the device and dtype of the model's LM head, in eval mode (heads follow the model)."""
    return module.to(device=model.get_output_embeddings().weight.device, dtype=lm_head_dtype(model)).eval()


def attach(module: nn.Module, model, base: BaseIdentity, what: str, check_identity: bool = True) -> nn.Module:
    """Check that a head built for `base` fits `model`, then place it on the model."""
    base.check_matches(BaseIdentity.of(model), what, check_identity)
    return place_like(module, model)


def save_checkpoint(module: nn.Module, directory: str | os.PathLike, config: dict) -> None:
    """config.json (with the head's `format` name and base identity inside `config`) + model.safetensors."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_NAME), "w") as f:
        json.dump(config, f, indent=2)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt"})


def load_weights(module: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """`module` (built from the directory's config.json) with the directory's weights, or an error naming the
    directory when they are missing or do not fit that config."""
    path = os.path.join(directory, WEIGHTS_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {str(directory)!r}: the directory holds a {CONFIG_NAME} but not "
                                "its weights; copy the whole directory, or save it again (save_pretrained)")
    try:
        load_state_in_its_dtype(module, load_file(path))
    except RuntimeError as err:  # load_state_dict: missing, unexpected or misshapen tensors
        details = " ".join(str(err).split())
        raise ValueError(f"{str(directory)!r}: its {CONFIG_NAME} does not describe its {WEIGHTS_NAME} ({details}); "
                         "was one of them edited or copied from another checkpoint? Save the directory again") from None
    return module


def config_dict(config) -> dict:
    return asdict(config) if is_dataclass(config) else dict(config)
