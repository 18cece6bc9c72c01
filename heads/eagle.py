"""The EAGLE head as users load and save it: `heads/eagle_module.py`'s module, reading and writing every supported
directory format. Dispatch only: this module imports the formats, which import the module, never this file.

    EagleHead.from_pretrained(directory, model=model)   # selfspec's own format, a published EAGLE-1/2 head, a
                                                        # vLLM EAGLE-1 export, a speculators EAGLE-3 draft or a
                                                        # SafeAILab EAGLE-3 head
    head.save_pretrained(directory, format="selfspec")  # or "vllm" ("eagle1" layout), "speculators" ("eagle3")
    is_eagle_directory(directory)                       # which kind a heads directory holds, whatever its format
"""
from __future__ import annotations

import os

from heads import eagle_formats, eagle_speculators
from heads.checkpoint import read_config
from heads.eagle_module import (  # noqa: F401  (the public names of heads.eagle)
    FORMAT_NAME, LAYOUTS, EagleConfig, EagleModule, default_feature_layers, is_eagle_config, layer_classes,
    layer_config,
)

FORMATS = ("selfspec", "vllm", "speculators")


def is_eagle_directory(directory: str | os.PathLike, raw: dict | None = None) -> bool:
    """Whether a heads directory (its config.json `raw`, read when not given) holds an EAGLE head in a format
    `EagleHead.from_pretrained` reads: selfspec's, the speculators format (whatever its kind: loading says what it
    runs), a published EAGLE-1/2/3 head or a vLLM EAGLE-1 export (an EAGLE architecture named, or `fc.weight` /
    `midlayer.*` tensors). Anything else is left to Medusa's loader, which names what it found."""
    raw = read_config(directory, "a heads directory") if raw is None else raw
    if is_eagle_config(raw) or eagle_speculators.is_speculators_config(raw) or eagle_formats.BASE_KEY in raw:
        return True
    if any("eagle" in str(name).lower() for name in raw.get("architectures") or ()):
        return True
    names = eagle_formats.published_weight_names(directory)
    return "fc.weight" in names or any(name.startswith("midlayer.") for name in names)


class EagleHead(EagleModule):
    def save_pretrained(self, directory: str | os.PathLike, format: str = "selfspec", model=None,
                        verifier_name_or_path: str | None = None) -> None:
        """Write config.json + model.safetensors. format="vllm" writes an "eagle1" head as vLLM's EAGLE-1 draft model
        (with `model`, also the base's embedding, which SafeAILab/EAGLE's loader needs); format="speculators" writes
        an "eagle3" head as the speculators package's EAGLE-3 draft, which vLLM serves (with `model`, also the base's
        embedding and architecture; `heads/eagle_speculators.py`), naming its verifier `verifier_name_or_path` (the
        base's hub id; default: the name of the base the head records, else `model`'s)."""
        if verifier_name_or_path is not None and format != "speculators":
            raise ValueError(f"verifier_name_or_path is written by format='speculators' only, not {format!r}")
        if format == "vllm":
            return eagle_formats.save_vllm(self, directory, model=model)
        if format == "speculators":
            return eagle_speculators.save_speculators(self, directory, model=model,
                                                      verifier_name_or_path=verifier_name_or_path)
        if format != "selfspec":
            raise ValueError(f"unknown EAGLE head format {format!r}; choose one of {FORMATS}")
        self.save_native(directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, model=None, check_base: bool = True) -> EagleHead:
        """Load a head saved by `save_pretrained` (any format), a published EAGLE-1/2 head, a vLLM EAGLE-1 export, a
        speculators EAGLE-3 draft or a SafeAILab EAGLE-3 head; with `model`, check it fits and move it to the model's
        device and dtype."""
        raw = read_config(directory, "an EAGLE head directory")
        if raw.get("format") == FORMAT_NAME:
            return cls.load_native(directory, raw, model, check_base)
        if eagle_speculators.is_speculators_config(raw):
            return eagle_speculators.load_speculators(cls, directory, raw, model, check_base)
        weights = eagle_formats.published_weights(directory)
        names = eagle_formats.published_weight_names(directory)
        if weights is not None and eagle_formats.is_safeailab_eagle3(raw, names):
            state = eagle_formats.read_published_weights(weights)
            return eagle_speculators.load_safeailab(cls, directory, raw, state, model, check_base)
        return eagle_formats.load_eagle1(cls, directory, raw, model, check_base)
