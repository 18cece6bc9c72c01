"""selfspec.__version__ and `selfspec --version`: the installed distribution's version, else pyproject.toml's."""
import importlib
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import selfspec
from selfspec import cli

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def pyproject_version() -> str:
    return re.search(r'^version = "([^"]+)"', PYPROJECT.read_text(), flags=re.M).group(1)


def test_the_fallback_version_is_pyprojects():
    assert selfspec._VERSION == pyproject_version()


def test_the_version_is_the_installed_distributions_else_the_fallback(monkeypatch):
    try:
        installed = metadata.version("selfspec")
    except metadata.PackageNotFoundError:
        installed = selfspec._VERSION
    assert selfspec.__version__ == installed

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    try:
        assert importlib.reload(selfspec).__version__ == pyproject_version()
    finally:
        monkeypatch.undo()
        importlib.reload(selfspec)


def test_version_flag_prints_the_version_and_exits_0(capsys):
    try:
        cli.main(["--version"])
    except SystemExit as stop:
        assert stop.code == 0
    assert capsys.readouterr().out.strip() == f"selfspec {selfspec.__version__}"


def test_version_flag_needs_no_torch():
    code = "import sys; from selfspec import cli; cli.build_parser(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
