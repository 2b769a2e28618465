"""Stand-ins in the student's process: captured output, the grader's objects lent to the student's code, and an
empty ``companion`` package whose only content is a ``check`` that does nothing.
"""

from __future__ import annotations

import builtins
import io
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .child import Server


class Capture(io.TextIOBase):
    """A stand-in for sys.stdout and sys.stderr that keeps the first ``limit`` characters and counts the rest."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.parts, self.kept, self.total = limit, [], 0, 0

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

    def text(self) -> str:
        return "".join(self.parts)


class Callback:
    """An object of the grader's (a scripted model, a sublayer): calls and attribute reads go back to the grader."""

    __slots__ = ("_server", "_node")

    def __init__(self, server: Server, node: dict) -> None:
        object.__setattr__(self, "_server", server)
        object.__setattr__(self, "_node", node)

    def _ask(self, header: dict, buffers: list[bytes]) -> Any:
        server = object.__getattribute__(self, "_server")
        reply, data = server.ask(header, buffers)
        if "error" in reply:
            error = reply["error"]
            cls = getattr(builtins, str(error.get("type")), None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = RuntimeError
            raise cls(str(error.get("message", "")))
        return server.decode(reply.get("value"), data)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        server = object.__getattribute__(self, "_server")
        buffers: list[bytes] = []
        header = {"op": "cb_call", "target": object.__getattribute__(self, "_node")["cb"],
                  "args": server.encode(args, buffers), "kwargs": server.encode(kwargs, buffers)}
        return self._ask(header, buffers)

    def __getattr__(self, name: str) -> Any:
        node = object.__getattribute__(self, "_node")
        return self._ask({"op": "cb_getattr", "target": node["cb"], "name": name}, [])

    def __repr__(self) -> str:
        return f"<{object.__getattribute__(self, '_node').get('type', 'object')} of the grader>"


def stand_in_companion() -> None:
    """``from companion.checks import check`` works in the sandbox; nothing else of the course is there."""
    package = types.ModuleType("companion", "The course's package is not available to graded code.")
    package.__path__ = []  # a package with no submodules: `import companion.torch` fails
    checks = types.ModuleType("companion.checks")

    def check(exercise_id: str, obj: Any = None) -> None:
        print(f"(check {exercise_id!r} is run by the grader)")

    checks.check = check
    checks.CheckFailed = type("CheckFailed", (AssertionError,), {})
    checks.__path__ = []
    package.checks = checks
    sys.modules["companion"], sys.modules["companion.checks"] = package, checks
    for name in [n for n in sys.modules if n.startswith("companion.") and n != "companion.checks"]:
        del sys.modules[name]
    # An editable install finds `companion.*` whatever the package's __path__ says: drop such finders.
    sys.meta_path[:] = [f for f in sys.meta_path if not str(getattr(f, "__module__", "")).startswith("__editable__")]
