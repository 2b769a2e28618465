"""The Jupyter commands the README and the book's how-to page tell a learner to type exist in the installed
environment (the course's own `jupyter lab` once failed with "Jupyter command `jupyter-lab` not found")."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "book" / "how_to_use.md"]
JUPYTER = re.compile(r"\.venv/bin/jupyter (?P<command>[a-z-]+)")


def documented_jupyter_commands() -> set[str]:
    return {match["command"] for path in DOCUMENTS for match in JUPYTER.finditer(path.read_text(encoding="utf-8"))}


def test_the_documents_name_jupyter_lab():
    assert "lab" in documented_jupyter_commands()


@pytest.mark.parametrize("command", sorted(documented_jupyter_commands()))
def test_every_documented_jupyter_command_runs(command):
    jupyter = Path(sys.executable).parent / "jupyter"
    done = subprocess.run([str(jupyter), command, "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"`jupyter {command} --version` failed: {done.stderr[-500:]}"


def test_jupyter_lab_opens_myst_notebooks():
    # jupytext's JupyterLab extension is what lets "Open With > Notebook" read the chapters' .md files
    jupyter = Path(sys.executable).parent / "jupyter"
    done = subprocess.run([str(jupyter), "labextension", "list"], capture_output=True, text=True, timeout=120)
    assert re.search(r"jupyterlab-jupytext\S* v[\d.]+ \S*enabled", done.stdout + done.stderr), done.stdout[-800:]
