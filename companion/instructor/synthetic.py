"""A synthetic class of students, for the class grader's tests and benchmark (an instructor's tool; not shipped).

``build_class(dest, students=40)`` writes ``dest/STUDENT/exercises/*.md``: every student is made from the course's
own material, so the expected grade of every exercise is known in advance:

- ``solution``: the reference answers (every exercise passes);
- ``stubs``: the generated exercise notebooks (every exercise fails: not implemented);
- ``mutant``: the reference answers with a few answers replaced by the typical mistakes committed in
  ``tests/test_exercises*.py``. The sandbox shows the student's process neither ``tests/`` nor the course's
  package, so each mistake is written into the notebook as self-contained source
  (:mod:`companion.instructor.mutant_source`): its factory with the bound arguments and its helpers, under names of
  their own, and a ``def`` (or ``class``) with the exercise's name that uses them. Mistakes that cannot be
  written as source are never picked;
- broken students: ``missing`` (some notebooks absent), ``empty`` (no notebook at all), ``not_utf8`` (a notebook
  saved as Latin-1), ``not_json`` (an ``.ipynb`` cut off in the middle), ``not_notebook`` (a ``.md`` with prose
  and no code) and ``endless`` (an answer that loops forever).

``python -m companion.instructor.synthetic DEST [--students N] [--chapters A,B]`` writes a class and its manifest
(``DEST/manifest.json``: per student, its kind and the exercises expected to pass).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

from companion.checks import exercises_for, registry

from .exercises import make_exercise
from .mutant_source import NotRenderable, render

ROOT = Path(__file__).resolve().parents[2]
#: Key in a mutant's name -> the test module that holds its table of typical mistakes.
MUTANT_MODULES = {
    "ch01": "test_exercises",
    "ch02_04": "test_exercises_ch02_04",
    "ch05_06": "test_exercises_ch05_06",
    "ch07": "test_exercises_ch07",
    "ch08": "test_exercises_ch08",
    "ch09": "test_exercises_ch09",
}
KINDS = ("solution", "mutant", "stubs", "mutant", "missing", "mutant", "not_utf8", "empty", "not_json", "endless",
         "not_notebook")
_MUTANT_NAME = re.compile(r"^mutant_(?P<key>[a-z0-9_]+?)_(?P<index>\d+)$")


def mutant_table(key: str) -> list[tuple[str, Any]]:
    """(exercise id, wrong answer) for every typical mistake of one test module, in the module's order."""
    if key not in MUTANT_MODULES:
        raise ValueError(f"key must be one of {', '.join(MUTANT_MODULES)}; got {key!r}")
    # Cached in sys.modules, not in a global of this module: the grader watches every global of the companion.
    name = f"_synthetic_mistakes_{key}"
    module = sys.modules.get(name)
    if module is None:
        path = ROOT / "tests" / f"{MUTANT_MODULES[key]}.py"
        if not path.exists():
            raise ValueError(f"the typical mistakes live in {path}, which is missing (a student release has no tests)")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    marks = [m for m in module.test_typical_mistakes_are_named.pytestmark if m.name == "parametrize"]
    argnames, argvalues = marks[0].args[:2]
    factory = argnames.split(",")[1].strip() in ("make_wrong", "make")  # chapters 5, 6, 8 store factories
    return [(case[0], case[1]() if factory else case[1]) for case in argvalues]


def mistake_classes() -> dict[str, list[tuple[str, str]]]:
    """Class of mistake -> (exercise id, mutant name) of every committed mutant of that class.

    A test module names its classes in ``MISTAKE_CLASSES`` (class -> the table entries of that class, which are
    also in its table of typical mistakes); entries of no class are left out.
    """
    found: dict[str, list[tuple[str, str]]] = {}
    for key in MUTANT_MODULES:
        mutant_table(key)  # imports the module
        module = sys.modules[f"_synthetic_mistakes_{key}"]
        marks = [m for m in module.test_typical_mistakes_are_named.pytestmark if m.name == "parametrize"]
        cases = list(marks[0].args[1])
        for kind, entries in getattr(module, "MISTAKE_CLASSES", {}).items():
            for entry in entries:
                index = next((i for i, case in enumerate(cases) if case is entry), None)
                if index is None:
                    raise ValueError(f"{MUTANT_MODULES[key]}: a mistake of class {kind!r} is not in the table")
                found.setdefault(kind, []).append((entry[0], mutant_name(key, index)))
    return found


def mutant_name(key: str, index: int) -> str:
    """The name of typical mistake ``index`` of the table ``key`` (``mutant_ch02_04_17``)."""
    return f"mutant_{key}_{index}"


def mutant_source(name: str, symbol: str) -> str:
    """Self-contained source that defines ``symbol`` as the typical mistake ``name`` (see :func:`mutant_name`).

    Raises:
        ValueError: no such mistake.
        NotRenderable: the mistake cannot be written as source.
    """
    match = _MUTANT_NAME.match(name)
    if not match:
        raise ValueError(f"name must look like mutant_ch02_04_17; got {name!r}")
    table = mutant_table(match["key"])
    index = int(match["index"])
    if index >= len(table):
        raise ValueError(f"{name}: the table has {len(table)} entries")
    return render(table[index][1], symbol, prefix=f"_{name}_")


def mutant_key(chapter: str) -> str:
    """The key of the test module that holds the typical mistakes of ``chapter`` (``02_attention`` -> ``ch02_04``)."""
    number = int(chapter.split("_", 1)[0])
    for key in MUTANT_MODULES:
        first, _, last = key[2:].partition("_")
        if int(first) <= number <= int(last or first):
            return key
    raise ValueError(f"no table of typical mistakes covers chapter {chapter!r}")


def mutants_by_exercise(chapters: list[str]) -> dict[str, dict[str, str]]:
    """Exercise id -> {mistake name: its source}, for the exercises of ``chapters`` (renderable mistakes only)."""
    symbols = {e.id: e.symbol for e in registry().values()}
    found: dict[str, dict[str, str]] = {}
    for key in dict.fromkeys(mutant_key(chapter) for chapter in chapters):
        for index, (exercise_id, _) in enumerate(mutant_table(key)):
            name = mutant_name(key, index)
            try:
                source = mutant_source(name, symbols[exercise_id])
            except NotRenderable:
                continue
            found.setdefault(exercise_id, {})[name] = source
    return found


def _called_elsewhere(symbol: str, text: str) -> bool:
    """Another function or class of the notebook uses ``symbol``: a wrong ``symbol`` would make it fail too."""
    for cell in re.findall(r"^```\{code-cell\}[^\n]*\n(.*?)^```", text, re.S | re.M):
        try:
            tree = ast.parse(cell)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name != symbol and any(
                    isinstance(inner, ast.Name) and inner.id == symbol for inner in ast.walk(node)):
                return True
    return False


def _code_cell(source: str) -> str:
    return f"\n```{{code-cell}} ipython3\n{source.rstrip()}\n```\n"


def _chapters(chapters: list[str] | None) -> list[str]:
    known = sorted({e.chapter for e in registry().values()})
    chosen = known if chapters is None else list(chapters)
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise ValueError(f"chapters must be among {', '.join(known)}; got {', '.join(unknown)}")
    return chosen


def build_student(folder: Path, kind: str, chapters: list[str], rng: random.Random,
                  solutions: Path = ROOT / "solutions",
                  mutants: dict[str, dict[str, str]] | None = None) -> dict[str, bool]:
    """Write one student of ``kind`` into ``folder/exercises``; return exercise id -> expected to pass.

    ``mutants`` is :func:`mutants_by_exercise` of ``chapters`` (computed here when not given).
    """
    if kind not in set(KINDS):
        raise ValueError(f"kind must be one of {', '.join(sorted(set(KINDS)))}; got {kind!r}")
    notebooks = folder / "exercises"
    notebooks.mkdir(parents=True, exist_ok=True)
    expected: dict[str, bool] = {}
    if kind == "empty":
        return {e.id: False for chapter in chapters for e in exercises_for(chapter)}
    if kind == "mutant" and mutants is None:
        mutants = mutants_by_exercise(chapters)
    dropped = set(rng.sample(chapters, max(1, len(chapters) // 2))) if kind == "missing" else set()
    broken_chapter = rng.choice(chapters)
    for chapter in chapters:
        items = exercises_for(chapter)
        text = (solutions / f"{chapter}.md").read_text(encoding="utf-8")
        passing = {e.id: True for e in items}
        target = notebooks / f"{chapter}.md"
        if chapter in dropped:
            passing = dict.fromkeys(passing, False)
            target = None
        elif kind == "stubs":
            text = make_exercise(text, target.name)
            passing = dict.fromkeys(passing, False)
        elif kind == "mutant":
            candidates = [e for e in items if mutants.get(e.id) and not _called_elsewhere(e.symbol, text)]
            wrong = rng.sample(candidates, k=min(2, len(candidates)))
            for item in wrong:
                text += _code_cell(mutants[item.id][rng.choice(sorted(mutants[item.id]))])
                passing[item.id] = False
        elif kind == "endless" and chapter == broken_chapter:
            looping = next(e for e in items if re.search(rf"^def {e.symbol}\(", text, re.M)
                           and not _called_elsewhere(e.symbol, text))
            text += _code_cell(f"def {looping.symbol}(*args, **kwargs):\n    while True:\n        pass")
            passing[looping.id] = False
        elif kind == "not_utf8" and chapter == broken_chapter:
            (notebooks / target.name).write_bytes((text + "\n<!-- Saved by an old editor: café -->\n").encode(
                "latin-1", "replace"))
            passing = dict.fromkeys(passing, False)
            target = None
        elif kind == "not_notebook" and chapter == broken_chapter:
            text = "# My answers\n\nI wrote them in answers.docx, next to this file.\n"
            passing = dict.fromkeys(passing, False)
        elif kind == "not_json" and chapter == broken_chapter:
            (notebooks / f"{chapter}.ipynb").write_text('{"cells": [{"cell_type": "code", "sou', encoding="utf-8")
            passing = dict.fromkeys(passing, False)
            target = None
        if target is not None:
            target.write_text(text, encoding="utf-8")
        expected.update(passing)
    return expected


def build_class(dest: str | Path, students: int = 40, chapters: list[str] | None = None, seed: int = 0,
                kinds: tuple[str, ...] = KINDS) -> dict[str, dict]:
    """Write ``students`` students into ``dest`` (cycling through ``kinds``); return and write the manifest.

    The manifest maps each student to ``{"kind": ..., "expected": {exercise id: expected to pass}}`` for the
    exercises of ``chapters`` (default: every chapter).
    """
    if students < 1:
        raise ValueError(f"students must be at least 1; got {students}")
    chosen = _chapters(chapters)
    dest = Path(dest)
    rng = random.Random(seed)
    manifest = {}
    mutants = mutants_by_exercise(chosen) if "mutant" in kinds[:students] else None
    for number in range(students):
        kind = kinds[number % len(kinds)]
        name = f"student{number + 1:03d}-{kind}"
        manifest[name] = {"kind": kind, "expected": build_student(dest / name, kind, chosen, rng, mutants=mutants)}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m companion.instructor.synthetic",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, nargs="?", help="folder to write the class into")
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--chapters", help="comma-separated chapter names (default: every chapter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", action="store_true",
                        help="print the committed mutants per class of mistake and per exercise; write nothing")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the tables of chapters 2-4 and 7 import Keras
    if args.classes:
        for kind, entries in mistake_classes().items():
            exercises = sorted({exercise_id for exercise_id, _ in entries})
            print(f"{kind}: {len(entries)} mutants over {len(exercises)} exercises")
            for exercise_id in exercises:
                print(f"    {exercise_id}: {sum(e == exercise_id for e, _ in entries)}")
        return 0
    if args.dest is None:
        parser.error("dest is required (unless --classes)")
    chapters = [c.strip() for c in args.chapters.split(",") if c.strip()] if args.chapters else None
    manifest = build_class(args.dest, args.students, chapters, args.seed)
    print(f"wrote {len(manifest)} students into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
