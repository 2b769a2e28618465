"""Write the student release of the course: ``make release DEST=../course-student`` (or
``python -m companion.instructor.release DEST``).

The release is what a student's repository starts from (a GitHub Classroom template, say): the chapters, the
exercise notebooks, the companion package with its checks, the book's pages and configuration, the data, and the
grading workflow, and the benchmarks with their multi-seed results (chapters 7-9 read those results and check that
the code behind them is the code shipped). It leaves out the reference answers (``solutions/``), the tests (their
tables of typical mistakes hold wrong *and* right answers), the instructor's file (``grading.toml``) and the
instructor's tools (``companion/instructor/``, this module among them).
A student README and Makefile replace the course's (no ``make test``, no ``make exercises``: both need the
solutions).

Before it finishes, the release is scanned for the code between every pair of ``### BEGIN SOLUTION`` /
``### END SOLUTION`` markers (and every prose answer) of ``solutions/``; a release that holds one is refused. The
only exceptions are the few exercises that re-implement a public function of the companion line for line
(``PUBLIC_TWINS``: ``shift_targets``): the course teaches that code on purpose.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from .exercises import CODE_BLOCK, PROSE_BLOCK

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
#: Shipped: files under these folders, and these files.
INCLUDE_DIRS = ("notebooks", "exercises", "companion", "book", "data", "benchmarks")
# actionlint.yaml names grade.yml's self-hosted runner labels, so the release's workflow lints clean on its own.
INCLUDE_FILES = ("_config.yml", "_toc.yml", "pyproject.toml", ".gitignore", ".github/workflows/grade.yml",
                 ".github/actionlint.yaml")
#: Never shipped, even under an included folder: the instructor's tools (this module among them), whole.
EXCLUDE_DIRS = ("companion/instructor",)
TEXT_SUFFIXES = {".md", ".py", ".yml", ".yaml", ".toml", ".txt", ".tsv", ".json", ".cfg", ".bib", ".ipynb", ""}
#: Exercises whose answer is, line for line, the body of a public function of the companion (``shift_targets``,
#: which the API reference shows): exercise -> the files that hold that function.
#: Only there may the answer appear in a release; anywhere else it is a leak.
PUBLIC_TWINS = {
    "teacher_forcing_split": ("companion/training.py",),
}

README = """\
# The Transformer, from text as numbers to a trained model (student edition)

An open course that builds the Transformer one piece at a time: read a chapter, then fill in its exercise notebook.

```bash
make book     # creates .venv, installs everything, builds the book into _build/html (runs every chapter)
make grade    # grades your exercises/ (TRACK=torch or TRACK=keras for one framework)
```

- `notebooks/`: the chapters; `exercises/`: your exercise notebooks (MyST Markdown; Jupyter opens them through
  jupytext, `make notebooks` writes `.ipynb` copies).
- Inside a notebook, `check("pad_batch", pad_batch)` checks one answer and says what looks wrong.
- `python -m companion.grade exercises` grades every notebook as your instructor will (see the book's page
  "Grading"). Each push runs `.github/workflows/grade.yml`, which grades your work with the course's checks.
"""

MAKEFILE = """\
# The student edition of the course. `make book` builds the book, `make grade` grades your exercises.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= 2

export TF_CPP_MIN_LOG_LEVEL ?= 3
export PYTHONHASHSEED ?= 0

.PHONY: help install book grade notebooks clean

help:
\t@echo "make book       build the HTML book into _build/html, executing every chapter"
\t@echo "make grade      grade your exercises/ (TRACK=torch or TRACK=keras for one framework)"
\t@echo "make notebooks  write .ipynb copies of every MyST notebook (for classic Jupyter)"

$(STAMP): pyproject.toml
\ttest -d $(VENV) || $(PYTHON) -m venv $(VENV)
\t$(PY) -m pip install -q "torch==2.13.0" || echo "torch 2.13.0 not available: using the range in pyproject.toml"
\t$(PY) -m pip install -q -e ".[book]"
\ttouch $@

install: $(STAMP)

# Two chapters at a time, the longest first (book/_ext/page_order.py); JOBS=4 on a machine with more cores.
book: $(STAMP)
\t$(PY) book/_ext/edition.py html en --jobs $(JOBS)

grade: $(STAMP)
\t$(PY) -m companion.grade exercises $(if $(TRACK),--track $(TRACK))

notebooks: $(STAMP)
\t$(VENV)/bin/jupytext --to ipynb notebooks/*.md exercises/*.md

clean:
\trm -rf _build notebooks/*.ipynb exercises/*.ipynb
"""


def source_files(source: Path = ROOT) -> list[str]:
    """The course's files (relative paths): what Git tracks, plus new files it does not ignore."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=source,
                                capture_output=True, check=True).stdout.decode().split("\0")
        return sorted({name for name in listed if name and (source / name).is_file()})
    except (OSError, subprocess.CalledProcessError):  # not a Git checkout: every file but the usual clutter
        skip = {".git", ".venv", "_build", "__pycache__", ".ipynb_checkpoints", ".pytest_cache"}
        return sorted(str(p.relative_to(source)) for p in source.rglob("*")
                      if p.is_file() and not skip & set(p.relative_to(source).parts) and p.suffix != ".ipynb")


def shipped(name: str) -> bool:
    if name.startswith(tuple(folder + "/" for folder in EXCLUDE_DIRS)):
        return False
    if "__pycache__" in name or name.endswith(".ipynb"):
        return False
    return name in INCLUDE_FILES or name.split("/", 1)[0] in INCLUDE_DIRS


def instructor_files(source: Path = ROOT) -> set[str]:
    """Files the instructor file names (its extra checks, the roster, the submission times): never shipped,
    wherever they are."""
    path = source / "grading.toml"
    if not path.exists():
        return set()
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    named = [data.get("grading", {}).get("extra_checks"), data.get("grading", {}).get("roster"),
             data.get("late", {}).get("submitted")]
    found = set()
    for name in filter(None, named):
        target = (source / str(name)).resolve()
        try:
            found.add(target.relative_to(source.resolve()).as_posix())
        except ValueError:  # outside the course: not shipped anyway
            pass
    return found


def _normal(text: str) -> str:
    return " ".join(text.split())


def solution_bodies(solutions: Path = ROOT / "solutions") -> list[tuple[str, str, str]]:
    """(notebook, answer's function or class, text) for every marked answer, code and prose, of the solutions."""
    found = []
    for path in sorted(solutions.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for match in CODE_BLOCK.finditer(text):
            before = text[: match.start()]
            owner = next(iter(reversed([line.split()[1].split("(")[0].rstrip(":") for line in before.splitlines()
                                        if line.startswith(("def ", "class "))])), "")
            body = textwrap.dedent("\n".join(match.group(0).splitlines()[1:-1]))
            found.append((path.name, owner, body))
        for match in PROSE_BLOCK.finditer(text):
            found.append((path.name, "", "\n".join(match.group(0).splitlines()[1:-1])))
    return [item for item in found if _normal(item[2])]


def _public_twin(owner: str, path: str) -> bool:
    """The answer of ``owner`` re-implements a public companion function that ``path`` defines (PUBLIC_TWINS)."""
    return path in PUBLIC_TWINS.get(owner, ())


def find_solution_text(folder: Path, solutions: Path = ROOT / "solutions") -> tuple[list[str], list[str]]:
    """Scan ``folder`` for every answer of ``solutions``; return (leaks, public twins) as readable lines."""
    texts = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            raw = path.read_text(encoding="utf-8", errors="replace")
            texts[str(path.relative_to(folder))] = _normal(raw)
    leaks, twins = [], []
    for notebook, owner, body in solution_bodies(solutions):
        needle = _normal(body)
        for name, normal in texts.items():
            if needle in normal:
                line = f"{name}: the answer of {owner or 'a prose question'} in solutions/{notebook}: {needle[:60]!r}"
                (twins if _public_twin(owner, name) else leaks).append(line)
    return leaks, twins


def build_release(dest: str | Path, source: Path = ROOT) -> list[str]:
    """Write the student release into ``dest`` (a new or empty folder); return the files written."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"dest must be a new or empty folder; {dest} is not")
    if dest.resolve() == source.resolve() or source.resolve() in dest.resolve().parents and \
            dest.resolve().relative_to(source.resolve()).parts[0] in INCLUDE_DIRS:
        raise ValueError(f"dest must not be inside a folder the release copies; got {dest}")
    hidden = instructor_files(source)
    names = [name for name in source_files(source) if shipped(name) and name not in hidden]
    missing = [name for name in INCLUDE_FILES if name not in names]
    if missing:
        raise ValueError(f"the course at {source} lacks {', '.join(missing)}")
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target)
    (dest / "README.md").write_text(README, encoding="utf-8")
    (dest / "Makefile").write_text(MAKEFILE, encoding="utf-8")
    leaks, _ = find_solution_text(dest, source / "solutions")
    if leaks:
        shutil.rmtree(dest)
        raise ValueError("the release would hold reference answers, so it was removed:\n  " + "\n  ".join(leaks))
    return [*names, "README.md", "Makefile"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m companion.instructor.release", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="a new or empty folder")
    args = parser.parse_args(argv)
    try:
        written = build_release(args.dest)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    _, twins = find_solution_text(args.dest)
    print(f"wrote {len(written)} files into {args.dest}; no reference answer in it "
          f"(the {len(twins)} copies of public companion functions are allowed: see PUBLIC_TWINS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
