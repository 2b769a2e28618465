"""The committed catalogue of typical mistakes, as a whole: every exercise has its mutants, and every mutant can be
handed to a student's process as self-contained source (companion/instructor/mutant_source.py) and still fails there
with the message it is committed with.

The per-chapter tests (test_exercises*.py) run each mistake in this process; here each is written as source, kept
the way the grader keeps a notebook's code (imports, functions, classes, literal constants), run in a fresh
namespace with no access to tests/, and checked again.
"""

from __future__ import annotations

import ast
import random
import re
import sys

import pytest

from companion.checks import CheckFailed, registry, run_check
from companion.instructor import synthetic
from companion.instructor.mutant_source import NotRenderable, render
from companion.notebook_code import definitions

MINIMUM_PER_EXERCISE = 3


def _catalogue() -> list[tuple[str, str, str, object]]:
    """(mutant name, exercise id, committed message, wrong answer) for every typical mistake of every table."""
    found = []
    for key in synthetic.MUTANT_MODULES:
        table = synthetic.mutant_table(key)
        module = sys.modules[f"_synthetic_mistakes_{key}"]
        marks = [m for m in module.test_typical_mistakes_are_named.pytestmark if m.name == "parametrize"]
        cases = marks[0].args[1]
        assert len(cases) == len(table)
        for index, ((exercise_id, wrong), case) in enumerate(zip(table, cases, strict=True)):
            found.append((synthetic.mutant_name(key, index), exercise_id, case[2], wrong))
    return found


CATALOGUE = _catalogue()


def test_every_registered_exercise_has_at_least_three_committed_mutants():
    counts = {exercise_id: 0 for exercise_id in registry()}
    for _, exercise_id, _, _ in CATALOGUE:
        assert exercise_id in counts, f"a mutant of {exercise_id!r}, which is not a registered exercise"
        counts[exercise_id] += 1
    short = {e: n for e, n in counts.items() if n < MINIMUM_PER_EXERCISE}
    assert not short, f"exercises with fewer than {MINIMUM_PER_EXERCISE} committed mutants: {short}"
    chapters = {e.chapter for e in registry().values()}
    assert {synthetic.mutant_key(c) for c in chapters} == set(synthetic.MUTANT_MODULES)


#: Exercises whose text names no type for what they return; every other exercise has a mutant of the wrong type.
NO_TYPE_NAMED = {"scalar_self_attention", "split_heads_torch", "split_heads_keras", "merge_heads_torch",
                 "merge_heads_keras", "summed_heads", "shift_encoding", "layer_norm", "teacher_forcing_split",
                 "warmup_lr", "greedy_decode_torch", "greedy_decode_keras", "temperature_softmax", "nucleus_probs"}
#: Exercises whose text names an input (a value, a boundary, a tie) that the cases once lacked.
NAMED_INPUTS = {"one_hot_batch", "embedding_gradient", "multi_head_attention_torch", "multi_head_attention_keras",
                "fixed_multi_head_attention_torch", "fixed_multi_head_attention_keras", "masked_attention_torch",
                "masked_attention_keras", "fixed_masked_attention_torch", "fixed_masked_attention_keras",
                "greedy_decode_torch", "greedy_decode_keras", "best_hypothesis", "bpe_merge", "best_pair",
                "nucleus_probs", "rms_norm", "apply_rope"}


def test_each_mistake_class_covers_every_exercise_it_applies_to():
    classes = synthetic.mistake_classes()
    assert set(classes) == {"an input the text names", "a type the text states"}
    names = {name for name, _, _, _ in CATALOGUE}
    assert all(name in names for entries in classes.values() for _, name in entries)
    typed = {exercise_id for exercise_id, _ in classes["a type the text states"]}
    assert typed == set(registry()) - NO_TYPE_NAMED
    assert {exercise_id for exercise_id, _ in classes["an input the text names"]} == NAMED_INPUTS


@pytest.mark.parametrize("name, exercise_id, message, wrong", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_each_mutant_fails_the_same_way_when_written_as_source(name, exercise_id, message, wrong):
    symbol = registry()[exercise_id].symbol
    source = render(wrong, symbol, prefix=f"_{name}_")
    code, problems = definitions(source)
    assert problems == []
    assert "companion" not in code and "test_" not in code
    defined = [target.id for node in ast.parse(code).body if isinstance(node, ast.Assign) for target in node.targets]
    defined += [node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef | ast.ClassDef)]
    assert defined.count(symbol) == 1, defined
    assert all(n.startswith(f"_{name}_") for n in defined if n != symbol), defined  # no clash with the notebook
    namespace = {"__name__": "student_notebook"}
    exec(compile(code, f"<{name}>", "exec"), namespace)
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, namespace[symbol])


# ---------------------------------------------------------------------------------------------------------------
# The renderer itself
# ---------------------------------------------------------------------------------------------------------------

OFFSET = 3


def _scaled(factor, shift=OFFSET):
    def scale(x, *, bias=0.5):
        return _helper(x) * factor + shift + bias

    return scale


def _helper(x):
    return x + OFFSET


class _Base:
    def value(self):
        return _helper(1)


def _subclass(extra):
    class Child(_Base):
        def value(self):
            return super().value() + extra

    return Child


def test_closures_helpers_and_classes_are_written_with_their_bound_values():
    namespace: dict = {"__name__": "student_notebook", "_helper": "the notebook's own", "OFFSET": -1}
    source = render(_scaled(2.0), "answer")
    exec(definitions(source)[0], namespace)
    assert namespace["answer"](1.0) == _scaled(2.0)(1.0) == (1 + 3) * 2 + 3 + 0.5
    assert namespace["answer"](1.0, bias=1.5) == 12.5
    assert namespace["_helper"] == "the notebook's own" and namespace["OFFSET"] == -1  # never replaced
    exec(definitions(render(_subclass(10), "Answer"))[0], namespace)
    assert namespace["Answer"]().value() == 14 and issubclass(namespace["Answer"], object)


def test_what_has_no_source_is_refused():
    with pytest.raises(NotRenderable, match="lambda"):
        render(lambda x: x, "answer")
    with pytest.raises(NotRenderable, match="cannot write"):
        render(_scaled(object()), "answer")
    with pytest.raises(NotRenderable, match="lambda"):
        render(_scaled(lambda: 1), "answer")


def test_a_synthetic_mutant_student_carries_the_mistake_not_an_import(tmp_path):
    expected = synthetic.build_student(tmp_path, "mutant", ["01_text_as_numbers"], random.Random(1))
    text = (tmp_path / "exercises" / "01_text_as_numbers.md").read_text(encoding="utf-8")
    assert "import companion.grade" not in text and "from companion.grade" not in text
    wrong = [e for e, passes in expected.items() if not passes]
    assert len(wrong) == 2
    assert all(re.search(rf"^(def|class) {registry()[e].symbol}\(", text, re.M) for e in wrong)
