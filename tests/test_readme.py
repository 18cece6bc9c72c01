"""The README's Python examples import what they say: every import line of its ```python blocks runs."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_imports() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if re.match(r"\s*(from \S+ import |import )", line)]


def test_the_readme_has_python_imports_to_check():
    assert any("selfspec" in line for line in readme_imports()) and any("heads" in line for line in readme_imports())


@pytest.mark.parametrize("line", readme_imports())
def test_each_readme_import_runs(line):
    exec(line, {})


def test_the_classmethods_the_readme_calls_exist():
    from heads import EagleHead, MedusaHeads
    from selfspec import SelfSpecModel

    classes = {"SelfSpecModel": SelfSpecModel, "EagleHead": EagleHead, "MedusaHeads": MedusaHeads}
    text = "\n".join(re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S))
    called = set(re.findall(r"\b(SelfSpecModel|EagleHead|MedusaHeads)\.(\w+)\(", text))
    assert ("SelfSpecModel", "from_pretrained") in called
    assert not [f"{name}.{attribute}" for name, attribute in called if not hasattr(classes[name], attribute)]


def test_ci_runs_exactly_the_readme_test_command():
    root = README.parent
    command = next(line for line in README.read_text().splitlines() if "python -m pytest tests" in line)
    assert "-c constraints.txt" in command  # (CI installs the versions the suite last passed with)
    assert command in (root / ".ci" / "run").read_text()
    pinned = [line for line in (root / "constraints.txt").read_text().splitlines() if line and line[0] != "#"]
    assert all("==" in line for line in pinned) and any(line.startswith("transformers==") for line in pinned)
