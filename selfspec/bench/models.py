"""What the benchmark decodes with: the model and tokenizer (through `selfspec.loading`: a directory, a .gguf file
or the `smollm2` alias), the optional heads, EAGLE and EAGLE-3 heads and draft model, and the exit layers. Knows nothing about
timing or reports.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from selfspec.bench.settings import BenchSettings, optional
from selfspec.kernel.quantized import quantized_weights
from selfspec.loading import load_model, load_tokenizer, resolve_model_path

# What creates each default directory (examples/reference/README.md has the full commands and their figures).
MAKE_MODEL = "python -m training.base --out examples/reference/model ... (see examples/reference/README.md)"
MAKE_HEADS = "python -m training.heads --model MODEL --data DATA --out HEADS (see README.md)"


@dataclass
class Loaded:
    model: object
    tokenizer: object
    heads: object | None  # MedusaHeads
    heads_dir: str | None
    eagle: object | None  # heads.eagle.EagleHead
    draft: object | None  # transformers' two-model assisted generation
    exit_layer: int
    untrained_exit_layer: int
    trained_exit_layer: int | None  # from the model's training log; None: not trained for early exit
    eos_token_id: int | list[int] | None
    eagle3_dir: str | None = None  # an EAGLE-3 head directory: SelfSpecModel loads it (heads=DIR)
    dequantized: object | None = None  # transformers' own float32 model where `model` keeps quantized blocks

    @property
    def transformers_model(self):
        """What transformers' rows (generate, assisted generation) run: the model as transformers loads it."""
        return self.dequantized if self.dequantized is not None else self.model

    @property
    def pad_token_id(self) -> int | None:
        return self.eos_token_id[0] if isinstance(self.eos_token_id, list) else self.eos_token_id


def parameters(module) -> tuple[int, int]:
    """(count, bytes) of a module's parameters; (0, 0) for None. The benchmark's one parameter counter."""
    if module is None:
        return 0, 0
    return (sum(p.numel() for p in module.parameters()),
            sum(p.numel() * p.element_size() for p in module.parameters()))


def _has_config(path: str | None) -> bool:
    """A heads or model directory counts only once its config.json exists (a half-written training output has none)."""
    return path is not None and (Path(path) / "config.json").is_file()


def check_paths(settings: BenchSettings) -> None:
    """Fail in one line, before loading anything, naming what creates a missing directory."""
    try:
        path = resolve_model_path(settings.model)
    except FileNotFoundError as err:
        raise SystemExit(f"selfspec.bench: {err}") from None
    if not (Path(path).is_file() or _has_config(path)):
        raise SystemExit(f"selfspec.bench: no model at {settings.model}; create the reference model with "
                         f"`{MAKE_MODEL}` or pass --model DIR, FILE.gguf or smollm2")
    if settings.heads is not None and not _has_config(settings.heads):
        raise SystemExit(f"selfspec.bench: no Medusa heads at {settings.heads}; create them with `{MAKE_HEADS}`, "
                         "or pass --heads none")
    draft = optional(settings.draft_model)
    if draft is not None and not _has_config(draft):
        raise SystemExit(f"selfspec.bench: no draft model at {draft}; pass --draft-model DIR or leave it out")


def load(settings: BenchSettings, notes: list[str]) -> Loaded:
    device = torch.device(settings.device)
    dtype = getattr(torch, settings.dtype)
    model = load_model(settings.model, dtype=dtype, device=device, quantized=settings.quantized)
    dequantized, kept = None, quantized_weights(model)
    if kept:
        # transformers' generate runs the file as transformers loads it (float32), not through selfspec's kernel
        dequantized = load_model(settings.model, dtype=dtype, device=device, quantized="dequantize")
        notes.append(f"selfspec's rows decode the GGUF file's blocks kept quantized (--quantized {settings.quantized}: "
                     f"{len(kept)} weights); generate runs transformers' dequantized float32 model of the same file")
    tokenizer = load_tokenizer(settings.model)
    if tokenizer is None:
        raise SystemExit(f"selfspec.bench: {settings.model} has no tokenizer; the benchmark prompts with text")
    heads = None
    if settings.heads is not None:
        from heads import MedusaHeads

        heads = MedusaHeads.from_pretrained(settings.heads, model=model).eval()
    draft_dir = optional(settings.draft_model)
    draft = load_model(draft_dir, dtype=dtype, device=device) if draft_dir is not None else None
    trained = _trained_exit_layer(settings.model)
    num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    exit_layer = settings.exit_layer or trained or max(1, num_layers // 4)
    # the useless-drafts check's early exit: on layers the model was not trained to exit at
    untrained = max(1, trained // 2) if trained and trained > 1 else exit_layer
    if trained is not None and untrained == trained:
        untrained = trained + 1
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.generation_config.eos_token_id
    eagle3 = optional(settings.eagle3)
    if eagle3 is not None and not _has_config(eagle3):
        notes.append(f"eagle3 skipped: no EAGLE-3 head at {eagle3} (no config.json)")
        eagle3 = None
    return Loaded(model, tokenizer, heads, settings.heads, load_eagle(settings.eagle, model, notes), draft,
                  exit_layer, untrained, trained, eos, eagle3, dequantized)


def load_eagle(directory: str | None, model, notes: list[str]):
    """The EAGLE head, or None with a note saying why there is no eagle row."""
    directory = optional(directory)
    if directory is None:
        return None
    if not _has_config(directory):
        notes.append(f"eagle skipped: no EAGLE head at {directory} (no config.json)")
        return None
    try:
        from heads.eagle import EagleHead
    except ImportError as err:
        notes.append(f"eagle skipped: heads.eagle does not import ({err})")
        return None
    try:
        return EagleHead.from_pretrained(directory, model=model).eval()
    except (OSError, ValueError, TypeError) as err:
        notes.append(f"eagle skipped: {directory} does not load for this model ({err})")
        return None


def _trained_exit_layer(model: str) -> int | None:
    """The layer a project-trained model learned to exit at (`python -m training.base --early-exit-loss L`)."""
    log = Path(model) / "training_log.json"
    if not log.is_file():
        return None
    return json.loads(log.read_text()).get("settings", {}).get("early_exit_loss") or None
