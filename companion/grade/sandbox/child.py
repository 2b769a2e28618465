"""The student's process: loads a notebook's definitions and answers the grader's requests about them.

It is forked, one per notebook, by the zygote (:mod:`.zygote`, started by :mod:`companion.grade.launcher` under
bubblewrap where it can) and talks to the trusted grader over two pipes (file descriptors passed by the grader)
with :mod:`.protocol`. It holds no expected value,
no checker and no reference implementation: the grader sends inputs and a call to make, this process runs the
student's code and sends back what came out (plain data, or a handle for an object that stays here). Requests:

- ``hello``: import the frameworks, put a stand-in ``companion.checks.check`` in place, set the tripwires;
- ``cell``: run the given top-level definitions of one code cell;
- ``lookup``: the student's object of a given name;
- ``call``, ``getattr``, ``setattr``: on an object that lives here;
- ``grad``: call, then back-propagate an upstream gradient and return the input and parameter gradients;
- ``arm``: the one-call shortcuts that the next exercise may not reach (they raise and are reported), and the
  exercise's track; what runs while the exercise is checked is watched for them (:mod:`.monitor`).

While student code runs it can ask the grader to run a callback (an object the checker passed in, such as a
scripted model): ``cb_call`` and ``cb_getattr``; the grader answers with data or another handle.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import os
import sys
import traceback
import types
from typing import Any

from . import protocol as P
from .monitor import Monitor, code_index
from .stand_ins import Callback, Capture, stand_in_companion

_MESSAGE_LIMIT = 4000


def _cut(text: str, limit: int = _MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f" ... ({len(text)} characters)"


class ShortcutUsed(Exception):
    """Raised by a tripwire: the exercise may not call this."""


class Server:
    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.reader = P.Reader(fd_in)
        self.fd_out = fd_out
        self.objects: dict[int, Any] = {}
        self.refs: dict[int, int] = {}
        self.module = types.ModuleType("student_notebook", "The definitions of the notebook being graded.")
        sys.modules[self.module.__name__] = self.module
        self.future_flags = 0
        self.armed: set[str] = set()
        self.monitor = Monitor(set())
        self.watch_index: dict[str, Any] = {}
        self.used: list[str] = []
        self.capture: Capture | None = None
        self.cell_marker = "<notebook"

    # -- values -------------------------------------------------------------------------------------------------

    def _other(self, value: Any) -> dict:
        key = id(value)
        number = self.refs.get(key)
        if number is None or self.objects.get(number) is not value:
            number = len(self.objects) + 1
            self.objects[number] = value
            self.refs[key] = number
        kind = type(value)
        mro = []
        for cls in getattr(kind, "__mro__", (kind,)):
            mro.append(f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', '?')}")
        name = getattr(value, "__name__", None) if isinstance(value, type | types.FunctionType) else None
        return {"ref": number, "type": mro[0], "mro": mro[:12], "callable": callable(value),
                "name": name if isinstance(name, str) else None}

    def encode(self, value: Any, buffers: list[bytes]) -> Any:
        return P.encode(value, buffers, self._other)

    def resolve(self, node: dict) -> Any:
        if "ref" in node:
            if node["ref"] not in self.objects:
                raise P.ProtocolError("an unknown handle")
            return self.objects[node["ref"]]
        return Callback(self, node)

    def decode(self, tree: Any, buffers: list[bytes]) -> Any:
        return P.decode(tree, buffers, self.resolve)

    # -- messages -----------------------------------------------------------------------------------------------

    def send(self, header: dict, buffers: list[bytes] | None = None) -> None:
        P.write_message(self.fd_out, header, buffers)

    def ask(self, header: dict, buffers: list[bytes]) -> tuple[dict, list[bytes]]:
        """Send a request to the grader and wait for its reply, serving the grader's own requests meanwhile."""
        self.send(header, buffers)
        while True:
            message, data = self.reader.read()
            if message.get("reply"):
                return message, data
            self.handle(message, data)

    def serve(self) -> None:
        while True:
            try:
                message, data = self.reader.read()
            except P.ChannelClosed:
                return
            if message.get("op") == "bye":
                self.send({"reply": True})
                return
            self.handle(message, data)

    def handle(self, message: dict, data: list[bytes]) -> None:
        op = message.get("op")
        outer = self.capture is None
        if outer:
            self.capture = Capture(int(message.get("output_limit", 4000)))
            self.used = []
            sys.stdout = sys.stderr = self.capture
        reply: dict = {"reply": True}
        buffers: list[bytes] = []
        try:
            handler = getattr(self, f"op_{op}", None)
            if handler is None:
                raise P.ProtocolError(f"unknown request {op!r}")
            reply.update(handler(message, data, buffers))
        except P.ProtocolError:
            raise
        except BaseException as error:  # the student's code raised (SystemExit and KeyboardInterrupt too)
            buffers = []
            reply["error"] = self.describe(error)
        finally:
            if outer:
                sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
                reply["output"] = self.capture.text()
                reply["output_chars"] = self.capture.total
                reply["shortcuts"] = list(dict.fromkeys(self.used + self.monitor.found))
                if self.monitor.switched_off:
                    reply["monitoring_off"] = True
                self.monitor.found, self.monitor.switched_off = [], False
                self.capture = None
        try:
            self.send(reply, buffers)
        except P.ChannelClosed:
            raise
        except Exception as error:  # e.g. a value that cannot be written as JSON
            self.send({"reply": True, "error": self.describe(error)})

    def describe(self, error: BaseException) -> dict:
        try:
            text = str(error)
        except BaseException:
            text = "<the exception's message could not be printed>"
        base = next((c for c in type(error).__mro__ if c.__module__ == "builtins"), Exception)
        where, line_text = "", ""
        for frame in traceback.extract_tb(error.__traceback__):
            if frame.filename.startswith(self.cell_marker):
                label = frame.filename[len(self.cell_marker):].strip(" <>,")
                where = f"{label}, line {frame.lineno}"
                line_text = (frame.line or "").strip()
        if isinstance(error, ShortcutUsed):
            text = f"{text} (not allowed in this exercise)"
        return {"type": type(error).__name__, "base": base.__name__, "message": _cut(text), "where": where,
                "line": _cut(line_text, 300), "not_implemented": isinstance(error, NotImplementedError)}

    # -- requests -----------------------------------------------------------------------------------------------

    def op_hello(self, message: dict, data: list, buffers: list) -> dict:
        self.cell_marker = str(message.get("cell_marker", self.cell_marker))
        imported = []
        for name in message.get("frameworks", []):
            for module in {"torch": ("torch",), "keras": ("keras",)}.get(name, ()):
                try:
                    importlib.import_module(module)
                    imported.append(module)
                except ImportError:
                    pass
        stand_in_companion()
        self.watch_index = code_index()  # before the tripwires and the student's code
        for dotted in message.get("tripwires", []):
            self.tripwire(str(dotted))
        try:
            os.chdir(message.get("cwd") or "/")
        except OSError:
            pass
        sys.path[:] = [p for p in sys.path if p not in ("", ".")]
        return {"ready": True, "imported": imported}

    def tripwire(self, dotted: str) -> None:
        module_name, _, attribute = dotted.rpartition(".")
        try:
            owner = importlib.import_module(module_name)
            original = getattr(owner, attribute)
        except (ImportError, AttributeError):
            return
        server = self

        def trip() -> None:
            if dotted in server.armed:
                server.used.append(dotted)
                raise ShortcutUsed(f"`{dotted}` is the one-call answer to this exercise")

        if isinstance(original, type):
            init = original.__init__

            def __init__(self, *args, **kwargs):  # noqa: N807
                trip()
                init(self, *args, **kwargs)

            original.__init__ = __init__
        elif callable(original):
            def wrapper(*args, **kwargs):
                trip()
                return original(*args, **kwargs)

            wrapper.__name__ = getattr(original, "__name__", attribute)
            wrapper.__doc__ = getattr(original, "__doc__", None)
            setattr(owner, attribute, wrapper)

    def op_arm(self, message: dict, data: list, buffers: list) -> dict:
        self.armed = {str(name) for name in message.get("names", [])}
        self.monitor = Monitor(self.armed, self.watch_index, operators=message.get("track") == "torch")
        return {}

    def op_cell(self, message: dict, data: list, buffers: list) -> dict:
        source, filename = message["source"], message["filename"]
        tree = ast.parse(source)
        problems = []
        for index in message.get("nodes", []):
            node = tree.body[index]
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                for alias in node.names:
                    feature = getattr(__future__, alias.name, None)
                    if feature is not None:
                        self.future_flags |= feature.compiler_flag
            try:
                code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec",
                               flags=self.future_flags, dont_inherit=True)
                exec(code, self.module.__dict__)
            except BaseException as error:  # the student's import, decorator or class body failed
                info = self.describe(error)
                line = info["where"].rpartition("line ")[2] or str(node.lineno)
                problems.append(f"line {line}: {info['type']}: {info['message']}" if info["message"]
                                else f"line {line}: {info['type']}")
        return {"problems": problems}

    def op_lookup(self, message: dict, data: list, buffers: list) -> dict:
        name = message["name"]
        if name not in self.module.__dict__:
            return {"missing": True}
        return {"value": self.encode(self.module.__dict__[name], buffers)}

    def op_call(self, message: dict, data: list, buffers: list) -> dict:
        target = self.objects[message["target"]]
        args = self.decode(message.get("args", {"tuple": []}), data)
        kwargs = self.decode(message.get("kwargs", {"dict": []}), data)
        torch = sys.modules.get("torch")
        owner = getattr(target, "__self__", None)
        if torch is not None and isinstance(owner, torch.nn.Parameter):  # e.g. weight.copy_(...): no autograd
            with torch.no_grad():
                result = target(*args, **kwargs)
        else:
            result = self.monitor.run(target, *args, **kwargs)
        return {"value": self.encode(result, buffers)}

    def op_getattr(self, message: dict, data: list, buffers: list) -> dict:
        value = getattr(self.objects[message["target"]], message["name"])
        return {"value": self.encode(value, buffers)}

    def op_setattr(self, message: dict, data: list, buffers: list) -> dict:
        setattr(self.objects[message["target"]], message["name"], self.decode(message["value"], data))
        return {}

    def op_grad(self, message: dict, data: list, buffers: list) -> dict:
        """Call ``target`` on inputs that require gradients, back-propagate ``upstream`` from output ``index``."""
        target = self.objects[message["target"]]
        args = list(self.decode(message.get("args", {"tuple": []}), data))
        kwargs = self.decode(message.get("kwargs", {"dict": []}), data)
        if message.get("framework") == "keras":
            from .keras_grad import keras_gradients

            def call(*a: Any) -> Any:
                return self.monitor.run(target, *a, **kwargs)

            result, found, why = keras_gradients(call, tuple(args), self.decode(message["upstream"], data),
                                                 message.get("index"))
            if why:
                return {"value": self.encode(result, buffers), "differentiable": False, "why": why}
            grads = {str(i): g for i, g in enumerate(found) if g is not None}
            return {"value": self.encode(result, buffers), "differentiable": True,
                    "grads": self.encode(grads, buffers), "params": self.encode({}, buffers)}
        import torch

        watched = []
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and arg.is_floating_point():
                args[i] = arg.detach().clone().requires_grad_(True)
                watched.append(i)
        result = self.monitor.run(target, *args, **kwargs)
        output = result
        index = message.get("index")
        if index is not None:
            output = result[index]
        upstream = self.decode(message["upstream"], data)
        if not isinstance(output, torch.Tensor):
            return {"value": self.encode(result, buffers), "differentiable": False,
                    "why": f"the output is a {type(output).__name__}, not a tensor"}
        if not output.requires_grad:
            return {"value": self.encode(result, buffers), "differentiable": False,
                    "why": "the output does not depend on the inputs through autograd (detached, or computed "
                           "outside torch)"}
        parameters = dict(target.named_parameters()) if isinstance(target, torch.nn.Module) else {}
        for parameter in parameters.values():
            parameter.grad = None
        output.backward(torch.ones_like(output) if upstream is None else torch.as_tensor(upstream, dtype=output.dtype))
        grads = {str(i): args[i].grad for i in watched}
        params = {name: p.grad for name, p in parameters.items()}
        return {"value": self.encode(result, buffers), "differentiable": True,
                "grads": self.encode(grads, buffers), "params": self.encode(params, buffers)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    fd_in, fd_out = int(argv[0]), int(argv[1])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - kept open for the life of the process
    server = Server(fd_in, fd_out)
    try:
        server.serve()
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
