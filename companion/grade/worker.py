"""The grading process: loads one notebook's definitions and runs the checks of its exercises.

It runs in a process of its own, started by :mod:`companion.grade.runner`, so that an endless loop, a crash or a
flood of output in the student's code cannot take the grader down. It reports to the parent through a pipe, one
JSON message per step:

- ``{"event": "ready"}`` once the frameworks and the checks are imported;
- ``{"event": "cell", "number": n, "problems": [...], "tampered": [...]}`` after loading each code cell;
- ``{"event": "result", "id": ..., "status": ..., "reason": ..., "message": ..., ...}`` after each exercise;
- ``{"event": "done"}`` at the end, or ``{"event": "fatal", "message": ...}`` if the grader itself fails.

The parent measures the time limit from one message to the next, so every step (importing one cell, checking one
exercise) has its own limit.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import io
import json
import os
import pkgutil
import re
import sys
import time
import traceback
import types
from typing import Any

#: Frameworks a track needs; imported before the student's code so their import time is not counted.
FRAMEWORKS = {"torch": ("torch", "companion.torch"), "keras": ("keras", "companion.keras")}
_TOP_LEVEL_IMPORT = re.compile(r"^(?:import|from)\s+(torch|keras|tensorflow|matplotlib)\b", re.M)
_MESSAGE_LIMIT = 4000


def preload_companion() -> None:
    """Import every companion module whose framework is loaded, so the guard's snapshot covers all of them.

    A module that imports torch, Keras or TensorFlow at its top, or that lives in ``companion.torch`` or
    ``companion.keras``, is skipped when that framework is not loaded (a NumPy-only grading run stays fast).
    Plotting modules (matplotlib) are skipped unless already loaded: no check draws.
    """
    import companion

    loaded = {name for name in ("torch", "keras", "tensorflow") if name in sys.modules}
    if "keras" in loaded:
        loaded.add("tensorflow")
    _import_tree(companion.__path__, "companion.", loaded)
    from companion.checks import registry

    registry()


def _import_tree(path: Any, prefix: str, loaded: set[str]) -> None:
    for info in pkgutil.iter_modules(path, prefix):
        if info.name.endswith("__main__"):
            continue
        module = sys.modules.get(info.name)
        if module is None:
            if _frameworks_needed(info) - loaded:
                continue
            try:
                module = importlib.import_module(info.name)
            except Exception:  # a half-written module of another chapter must not stop the grading of this one
                continue
        if info.ispkg and hasattr(module, "__path__"):
            _import_tree(module.__path__, info.name + ".", loaded)


def _frameworks_needed(info: pkgutil.ModuleInfo) -> set[str]:
    needed = {part for part in info.name.split(".") if part in ("torch", "keras", "tensorflow")}
    try:
        spec = info.module_finder.find_spec(info.name)  # type: ignore[call-arg, union-attr]
        with open(spec.origin, encoding="utf-8") as file:  # type: ignore[union-attr, arg-type]
            needed |= set(_TOP_LEVEL_IMPORT.findall(file.read()))
    except Exception:
        pass
    return needed


class _Capture(io.TextIOBase):
    """A stand-in for sys.stdout and sys.stderr that keeps the first ``limit`` characters and counts the rest."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0
        self.buffer = _ByteCapture(self)

    def write(self, text: Any) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.total += len(text)
        if self.kept < self.limit:
            part = text[: self.limit - self.kept]
            self.parts.append(part)
            self.kept += len(part)
        return len(text)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def text(self) -> str:
        return "".join(self.parts)


class _ByteCapture:
    def __init__(self, owner: _Capture) -> None:
        self.owner = owner

    def write(self, data: bytes) -> int:
        return self.owner.write(bytes(data).decode("utf-8", "replace"))

    def flush(self) -> None:
        pass


def _describe(error: BaseException) -> str:
    """``Type: message`` for an exception raised by the student's code, safely and briefly."""
    try:
        text = str(error)
    except Exception:
        text = "<the exception's message could not be printed>"
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return _cut(text)


def _cut(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f" ... ({len(text)} characters)"


def _line_in(error: BaseException, filename: str, default: int) -> int:
    """The line of the cell where the error happened (the innermost frame in that cell)."""
    line = default
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename == filename and frame.lineno:
            line = frame.lineno
    return line


class Worker:
    """One notebook, graded step by step (see the module docstring for the messages)."""

    def __init__(self, plan: dict, channel: Any) -> None:
        self.plan = plan
        self.channel = channel
        self.limit = int(plan.get("output_limit", 4000))
        self.future_flags = 0

    def send(self, message: dict) -> None:
        self.channel.send_bytes(json.dumps(message).encode("utf-8"))

    def run(self) -> None:
        for framework in self.plan.get("frameworks", []):
            for module in FRAMEWORKS.get(framework, ()):
                try:
                    importlib.import_module(module)
                except ImportError:
                    break
        preload_companion()
        from companion.checks import CheckFailed, exercises_for

        from .guard import Guard

        known = {item.id: item for item in exercises_for(self.plan["chapter"])}
        # The checkers are taken now, before any of the student's code runs: rebinding them later changes nothing.
        checkers = {}
        for item in self.plan["exercises"]:
            checkers[item["id"]] = (known[item["id"]].symbol, known[item["id"]].checker)
        self.check_failed = CheckFailed
        guard = Guard()

        sys.path[:] = [entry for entry in sys.path if entry not in ("", ".")]
        try:
            os.chdir(self.plan.get("cwd") or ".")
        except OSError:
            pass
        module = types.ModuleType("student_notebook", "The definitions of the notebook being graded.")
        module.__file__ = self.plan.get("path")
        sys.modules[module.__name__] = module
        namespace = module.__dict__
        self.send({"event": "ready"})

        for cell in self.plan["cells"]:
            problems, output = self.load_cell(cell, namespace)
            changes = _safe_changes(guard)
            self.send({"event": "cell", "number": cell["number"], "problems": problems, "tampered": changes,
                       "output_chars": output.total})
            if changes:
                return  # the parent leaves this cell out and starts a fresh process

        for item in self.plan["exercises"]:
            symbol, checker = checkers[item["id"]]
            result = self.check(item["id"], symbol, checker, namespace)
            changes = _safe_changes(guard)
            if changes:
                result.update(status="failed", reason="tampered", tampered=changes)
            self.send(result)
            if changes:
                return
        self.send({"event": "done"})

    # -- loading definitions ----------------------------------------------------------------------------------

    def load_cell(self, cell: dict, namespace: dict) -> tuple[list[str], _Capture]:
        from companion.notebook_code import definition_nodes

        nodes, problems = definition_nodes(cell["source"])
        output = _Capture(self.limit)
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                for alias in node.names:
                    feature = getattr(__future__, alias.name, None)
                    if feature is not None:
                        self.future_flags |= feature.compiler_flag
            try:
                code = compile(
                    ast.Module(body=[node], type_ignores=[]), cell["filename"], "exec",
                    flags=self.future_flags, dont_inherit=True,
                )
            except SyntaxError as error:
                problems.append(f"line {error.lineno or node.lineno}: {error.msg}")
                continue
            sys.stdout = sys.stderr = output
            try:
                exec(code, namespace)
            except BaseException as error:  # the student's import, decorator or class body failed
                line = _line_in(error, cell["filename"], node.lineno)
                problems.append(f"line {line}: {_describe(error)}")
            finally:
                sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        return problems, output

    # -- checking ---------------------------------------------------------------------------------------------

    def check(self, exercise_id: str, symbol: str, checker: Any, namespace: dict) -> dict:
        result = {"event": "result", "id": exercise_id, "status": "failed", "output": "", "output_chars": 0}
        answer = namespace.get(symbol, _MISSING)
        if answer is _MISSING:
            return result | {"reason": "missing", "seconds": 0.0,
                             "message": f"define `{symbol}`: the notebook has no function or class of that name"}
        output = _Capture(self.limit)
        start = time.perf_counter()
        sys.stdout = sys.stderr = output
        try:
            checker(answer)
            reason, message = "ok", ""
        except self.check_failed as failure:
            reason, message = "wrong", _cut(str(failure))
        except NotImplementedError:
            reason, message = "not-implemented", "not implemented yet (replace the `raise NotImplementedError`)"
        except AssertionError as failure:
            reason, message = "wrong", _cut(str(failure)) or "the check failed"
        except Exception as error:  # the checker tripped over the answer, e.g. a list where a tensor was expected
            reason, message = "error", f"the check could not use your answer: {_describe(error)}"
        except BaseException as error:  # SystemExit, KeyboardInterrupt, ... raised by the student's code
            reason, message = "error", f"your code raised {_describe(error)}"
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        return result | {
            "status": "passed" if reason == "ok" else "failed",
            "reason": reason,
            "message": message,
            "seconds": round(time.perf_counter() - start, 4),
            "output": output.text(),
            "output_chars": output.total,
        }


_MISSING = object()


def _safe_changes(guard: Any) -> list[str]:
    try:
        return guard.changes()
    except Exception as error:  # the student's code broke something the guard reads: that is a change too
        return [f"the grading code could not be inspected ({_describe(error)})"]


def _isolate(output: Any) -> None:
    """Own process group; stdin from /dev/null; stdout and stderr into the capped pipe (or /dev/null)."""
    if hasattr(os, "setsid"):
        try:
            os.setsid()  # so the parent can kill whatever the student's code starts, too
        except OSError:
            pass
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    target = output.fileno() if output is not None and os.name == "posix" else devnull
    os.dup2(target, 1)
    os.dup2(target, 2)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - kept open for the life of the process


def main(plan: dict, channel: Any, output: Any = None) -> None:
    """Entry point of the grading process (the target of a multiprocessing.Process)."""
    try:
        _isolate(output)
        Worker(plan, channel).run()
    except BaseException:
        try:
            channel.send_bytes(json.dumps({"event": "fatal", "message": _cut(traceback.format_exc())}).encode())
        except BaseException:
            pass
    finally:
        try:
            channel.close()
        finally:
            os._exit(0)
