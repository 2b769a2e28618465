"""What the grader found: one result per exercise, one per notebook, one report per run."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

#: Why an exercise got its status (``ExerciseResult.reason``).
REASONS = {
    "ok": "the check passed",
    "wrong": "the check found a wrong answer",
    "missing": "the notebook does not define the function or class",
    "not-implemented": "the exercise still raises NotImplementedError",
    "error": "the check could not use the answer",
    "timeout": "the check did not finish in time",
    "crash": "the grading process died while checking",
    "stalled": "the check made no progress in the grader's own process and was given up (the grader's fault, "
               "unless the answer returned something enormous)",
    "shortcut": "the answer reaches the course's or the framework's own implementation of the exercise",
    "hidden": "an instructor's extra check failed",
    "missing-notebook": "the chapter's notebook is missing (or was renamed)",
    "unreadable": "the notebook file could not be read",
    "track": "the exercise belongs to a track that was not selected",
}


@dataclass
class ExerciseResult:
    """The verdict on one exercise of one notebook."""

    id: str
    track: str
    title: str
    status: str  # PASSED, FAILED or SKIPPED
    reason: str  # a key of REASONS
    message: str
    seconds: float = 0.0
    output: str = ""  # what the student's code printed while it was checked, cut to the limit
    output_chars: int = 0  # how many characters it printed in all
    parts: list[list] = field(default_factory=list)  # [name, passed] of each part, when a check with parts failed

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def failed(self) -> bool:
        return self.status == FAILED


@dataclass
class NotebookResult:
    """The verdicts on one notebook, plus what went wrong with the notebook itself."""

    path: str
    chapter: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # warnings: syntax errors, cells that failed to load, ...
    error: str = ""  # set when the notebook could not be graded at all
    seconds: float = 0.0
    missing: bool = False  # an expected chapter without a notebook: its exercises failed
    sandbox: str = ""  # "on" or "off": whether the student's code ran under bubblewrap

    def count(self, status: str) -> int:
        return sum(result.status == status for result in self.exercises)

    @property
    def ok(self) -> bool:
        """No error and no failed exercise."""
        return not self.error and self.count(FAILED) == 0

    def result(self, exercise_id: str) -> ExerciseResult:
        for result in self.exercises:
            if result.id == exercise_id:
                return result
        raise KeyError(f"{self.path} has no result for {exercise_id!r}")


@dataclass
class GradeReport:
    """Every notebook of one grading run."""

    notebooks: list[NotebookResult] = field(default_factory=list)
    seconds: float = 0.0
    sandbox: str = ""  # "on", or "off (why)"
    expected_chapters: list[str] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(notebook.count(status) for notebook in self.notebooks)

    @property
    def graded(self) -> int:
        return self.count(PASSED) + self.count(FAILED)

    @property
    def ok(self) -> bool:
        """Exit status 0: at least one exercise was graded, all of them passed and every notebook could be read."""
        return self.graded > 0 and all(notebook.ok for notebook in self.notebooks)

    def to_dict(self) -> dict:
        return {
            "passed": self.count(PASSED),
            "failed": self.count(FAILED),
            "skipped": self.count(SKIPPED),
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "sandbox": self.sandbox,
            "expected_chapters": list(self.expected_chapters),
            "missing_chapters": [n.chapter for n in self.notebooks if n.missing],
            "notebooks": [asdict(notebook) for notebook in self.notebooks],
        }


# Characters that are not allowed in XML 1.0 (C0 controls but tab and newline, surrogates, U+FFFE, U+FFFF) or
# that a terminal acts on (escape sequences, carriage return, C1 controls such as CSI, bidirectional overrides).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
                     "\ufffe\uffff]")


def clean_text(text: object) -> str:
    """``text`` safe for a terminal, JSON and XML: every unsafe character is shown as text (``\\x1b``,
    ``\\u202e``), so an escape sequence can neither act on the terminal nor break a report."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", str(text))


def clean_result(notebook: NotebookResult) -> NotebookResult:
    """Every string of a notebook's results cleaned with :func:`clean_text` (the one place it is done: every
    report, the table and the class's files are written from these results)."""
    for item in (notebook, *notebook.exercises):
        for spec in fields(item):
            value = getattr(item, spec.name)
            if isinstance(value, str):
                setattr(item, spec.name, clean_text(value))
    notebook.problems = [clean_text(problem) for problem in notebook.problems]
    return notebook
