"""Multi-seed evidence that the chapters cite: a result file in ``benchmarks/results/`` records where its numbers come
from, and a test (``tests/test_evidence.py``) fails when the code they depend on has changed since.

A benchmark writes its results with ``write_evidence``::

    write_evidence("benchmarks/results/translation_seeds.json", results,
                   seeds=[0, 1, 2, 3, 4], code=["companion/training.py", "companion/torch/model.py"])

The file holds ``{"provenance": {...}, "results": results}``. The provenance names the command, the seeds, the date,
the machine, the versions of Python, NumPy, PyTorch, TensorFlow and Keras, and a SHA-256 of each listed code file
(paths relative to the repository, folders taken whole). A Python file is hashed by its syntax tree without
docstrings, a MyST notebook by its code cells and another result file by its results, so an edit of a comment, a
docstring or a chapter's prose leaves the evidence valid and any change of what the code does makes it stale.
``data`` names inputs whose hashes are recorded but not checked: the course's own pages that chapter 8's corpus is
made of change with every prose edit, and the chapters' claims must hold for any such edit anyway. A chapter reads
``results`` with ``read_evidence``; ``stale_code`` says which code files changed since the file was written."""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _files(code: list[str]) -> list[Path]:
    files: list[Path] = []
    for name in code:
        path = ROOT / name
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts))
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"code: {name!r} is neither a file nor a folder of the repository")
    return files


#: How code files are hashed; a result file without a "hashing" entry was hashed byte for byte, and one with
#: "python-ast" hashed notebooks byte for byte.
HASHING = "python-ast+notebook-code"
HASHINGS = ("bytes", "python-ast", HASHING)


def _without_docstrings(source: bytes) -> bytes:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def _notebook_code(source: bytes) -> bytes:
    """The code cells of a MyST notebook (their source and metadata), in order: what executing it runs."""
    import jupytext

    notebook = jupytext.reads(source.decode(), fmt="md:myst")
    cells = [{"source": cell.source, "metadata": dict(cell.metadata)}
             for cell in notebook.cells if cell.cell_type == "code"]
    return json.dumps(cells, sort_keys=True).encode()


def _digest(path: Path, hashing: str) -> str:
    if hashing not in HASHINGS:
        raise ValueError(f"hashing: expected one of {HASHINGS}, got {hashing!r}")
    content = path.read_bytes()
    if hashing != "bytes" and path.suffix == ".py":
        content = _without_docstrings(content)
    elif hashing == HASHING and path.suffix == ".md" and content.startswith(b"---\njupytext:"):
        content = _notebook_code(content)
    elif hashing == HASHING and path.suffix == ".json" and path.parent == RESULTS:
        # another result file: what a claim rests on is its results, not when or how its hashes were recorded
        content = json.dumps(json.loads(content)["results"], sort_keys=True).encode()
    return hashlib.sha256(content).hexdigest()


def code_hashes(code: list[str], hashing: str = HASHING) -> dict[str, str]:
    """SHA-256 of each file named in ``code`` (folders expanded), keyed by its path relative to the repository."""
    return {str(p.relative_to(ROOT)): _digest(p, hashing) for p in _files(code)}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def write_evidence(path: str | Path, results: Any, *, seeds: list[int], code: list[str], data: list[str] = (),
                   command: str | None = None, notes: str = "") -> Path:
    """Write ``results`` (JSON-serialisable) with its provenance to ``path``; return the path."""
    if not seeds:
        raise ValueError("seeds: a multi-seed result needs at least one seed")
    provenance = {
        "command": command or " ".join(["python", *sys.argv]),
        "seeds": list(seeds),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": f"{platform.machine()}, {platform.processor() or 'unknown processor'}, "
                   f"{platform.system()} {platform.release()}",
        "versions": {name: _version(name) for name in ("numpy", "torch", "tensorflow", "keras")}
                    | {"python": platform.python_version()},
        "hashing": HASHING,
        "code": code_hashes(code),
        "data": code_hashes(list(data)),
        "notes": notes,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provenance": provenance, "results": results}, indent=1) + "\n")
    return path


def read_evidence(name: str) -> dict[str, Any]:
    """The whole file ``benchmarks/results/<name>`` (``provenance`` and ``results``)."""
    return json.loads((RESULTS / name).read_text())


def stale_code(evidence: dict[str, Any]) -> list[str]:
    """The files whose content changed (or that disappeared or appeared) since ``evidence`` was written."""
    recorded = evidence["provenance"]["code"]
    hashing = evidence["provenance"].get("hashing", "bytes")
    folders = sorted({name for name in recorded if not (ROOT / name).is_file()})
    now = code_hashes([name for name in recorded if (ROOT / name).is_file()], hashing)
    changed = [name for name, digest in recorded.items() if now.get(name) != digest]
    return sorted(set(changed) | set(folders))


def rehash(path: str | Path) -> list[str]:
    """Record ``path``'s code hashes in the current ``HASHING`` after checking them in the recorded one.

    Nothing is recomputed: the results stay as they are, and the file is rewritten only when every recorded hash
    still matches (otherwise the stale files are returned and the file is left alone). The provenance keeps the
    former mode under ``rehashed_from``.
    """
    path = Path(path)
    evidence = json.loads(path.read_text())
    stale = stale_code(evidence)
    if stale:
        return stale
    provenance = evidence["provenance"]
    former = provenance.get("hashing", "bytes")
    if former != HASHING:
        provenance["code"] = code_hashes(list(provenance["code"]), HASHING)
        provenance["hashing"] = HASHING
        provenance["rehashed_from"] = former
        path.write_text(json.dumps(evidence, indent=1) + "\n")
    return []


if __name__ == "__main__":
    # python benchmarks/evidence.py rehash FILE ...: move result files to the current hashing, checking first.
    if len(sys.argv) < 3 or sys.argv[1] != "rehash":
        sys.exit("usage: python benchmarks/evidence.py rehash RESULT_FILE ...")
    failed = {name: rehash(name) for name in sys.argv[2:]}
    for name, stale in failed.items():
        print(f"{name}: " + (f"NOT rehashed, stale code: {', '.join(stale)}" if stale else "hashes checked, rehashed"))
    sys.exit(1 if any(failed.values()) else 0)
