"""The EAGLE head as users load and save it: `heads/eagle_module.py`'s module, reading and writing every supported
directory format. Dispatch only: this module imports the formats, which import the module, never this file.

    EagleHead.from_pretrained(directory, model=model)   # selfspec's own format, a published EAGLE-1/2 head, a
                                                        # vLLM EAGLE-1 export or a speculators EAGLE-3 draft
    head.save_pretrained(directory, format="selfspec")  # or "vllm" ("eagle1" layout), "speculators" ("eagle3")
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


class EagleHead(EagleModule):
    def save_pretrained(self, directory: str | os.PathLike, format: str = "selfspec", model=None) -> None:
        """Write config.json + model.safetensors. format="vllm" writes an "eagle1" head as vLLM's EAGLE-1 draft model
        (with `model`, also the base's embedding, which SafeAILab/EAGLE's loader needs); format="speculators" writes
        an "eagle3" head as the speculators package's EAGLE-3 draft, which vLLM serves (with `model`, also the base's
        embedding and architecture; `heads/eagle_speculators.py`)."""
        if format == "vllm":
            return eagle_formats.save_vllm(self, directory, model=model)
        if format == "speculators":
            return eagle_speculators.save_speculators(self, directory, model=model)
        if format != "selfspec":
            raise ValueError(f"unknown EAGLE head format {format!r}; choose one of {FORMATS}")
        self.save_native(directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, model=None, check_base: bool = True) -> EagleHead:
        """Load a head saved by `save_pretrained` (any format), a published EAGLE-1/2 head, a vLLM EAGLE-1 export or
        a speculators EAGLE-3 draft; with `model`, check it fits and move it to the model's device and dtype."""
        raw = read_config(directory, "an EAGLE head directory")
        if raw.get("format") == FORMAT_NAME:
            return cls.load_native(directory, raw, model, check_base)
        if eagle_speculators.is_speculators_config(raw):
            return eagle_speculators.load_speculators(cls, directory, raw, model, check_base)
        return eagle_formats.load_eagle1(cls, directory, raw, model, check_base)
