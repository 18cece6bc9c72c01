"""The JSON files shipped with selfspec (example heads' config.json, their training settings and logs) name no folder
of the machine that wrote them: vLLM reads a head's verifier from its config.json, and a path of a trainer's
virtualenv or run folder names nothing on a user's machine (heads record names through `loading.portable_name`)."""
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# tokenizer.json is a vocabulary: its strings are tokens such as "/" and "~", not names
SHIPPED = sorted(path for folder in ("examples", "heads") for path in (ROOT / folder).rglob("*.json")
                 if path.name != "tokenizer.json")
MACHINE_FOLDERS = ("/work/", "/tmp/", "/home/", "/root/")


def machine_paths(value) -> list[str]:
    """Every string inside a JSON value that is an absolute path or names a machine folder such as /home/."""
    if isinstance(value, dict):
        return [found for item in value.values() for found in machine_paths(item)]
    if isinstance(value, list):
        return [found for item in value for found in machine_paths(item)]
    if isinstance(value, str) and (os.path.isabs(value) or value.startswith("~")
                                   or any(folder in value for folder in MACHINE_FOLDERS)):
        return [value]
    return []


def test_the_examples_ship_json_files():
    assert any(path.name == "config.json" for path in SHIPPED)  # the walk below sees the head configs


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_shipped_json_names_a_machine_path(path):
    found = machine_paths(json.loads(path.read_text()))
    assert not found, (f"{path.relative_to(ROOT)} names this machine's folders {found}: write a hub id or a relative "
                       "name (selfspec.loading.portable_name)")


def test_machine_paths_finds_them_at_any_depth():
    assert machine_paths({"a": [{"b": "/opt/model"}], "c": "runs/x", "d": "see /home/me", "e": 3}) == [
        "/opt/model", "see /home/me"]
    assert machine_paths(["HuggingFaceTB/SmolLM2-135M-Instruct", "**/*.txt", None]) == []
