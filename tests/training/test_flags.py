"""training/flags.py: the settings a run records name every path the user gave by a portable name (no folder of the
machine that trained), keep everything else as it is, and stay JSON (tuples become lists)."""
from dataclasses import dataclass

from training.flags import portable_record, settings_record


@dataclass(frozen=True)
class Settings:
    model: str = "/work/runs/reference-model"
    out: str = "examples/reference/heads"
    data: tuple[str, ...] = ("/tmp/data/a", "stdlib")
    glob: str = "**/*.txt"
    lr: float = 0.01
    init: str = ""
    tokenizer: str | None = None


def test_settings_record_shortens_absolute_paths_only():
    assert settings_record(Settings()) == {
        "model": "reference-model", "out": "examples/reference/heads", "data": ["a", "stdlib"], "glob": "**/*.txt",
        "lr": 0.01, "init": "", "tokenizer": None,
    }


def test_portable_record_walks_nested_values():
    assert portable_record({"settings": {"out": "/home/me/runs/x/"}, "steps": [1, "/root/y"]}) == {
        "settings": {"out": "x"}, "steps": [1, "y"]}
