"""The trusted side of a student's process: requests with deadlines, and proxies that stand in for its objects.

A checker receives a :class:`Remote` where the notebook defines a function or a class. Calling it, reading or
setting an attribute goes over the pipe (:mod:`companion.grade.sandbox.protocol`); what comes back is rebuilt
here as the type the student's code returned (``list``, ``numpy.ndarray``, ``torch.Tensor``, a Keras tensor, a
NumPy scalar, ``int``, ...), or as another :class:`Remote` for an object that is not data (a layer, a parameter).
Objects the checker passes in that are not data (a scripted model, a sublayer) stay here: the student's code
gets a handle whose calls come back to this process (:meth:`Session.serve_callback`).

Nothing here runs the student's code or unpickles what it sent.
"""

from __future__ import annotations

import builtins
import os
import sys
import time
from typing import Any

from companion.checks import register_proxy

from .launcher import Child
from .sandbox import protocol as P


class SandboxLost(BaseException):  # noqa: N818 - not an Exception: checkers must not catch it
    """The student's process timed out, died, or broke the protocol: the step fails and a fresh process goes on."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason  # "timeout", "crash" or "protocol"
        self.detail = detail


class StudentError(Exception):
    """An exception raised by the student's code, rebuilt from its description (type name, message, line)."""

    where: str = ""
    line: str = ""


_ERROR_TYPES: dict[tuple[str, str], type] = {}


def rebuild_error(info: dict) -> BaseException:
    message = str(info.get("message", ""))
    if info.get("not_implemented"):
        return NotImplementedError(message)
    name = str(info.get("type", "Exception"))
    if not name.isidentifier():
        name = "Exception"
    base = getattr(builtins, str(info.get("base", "")), None)
    bases: tuple[type, ...] = (StudentError,)
    if isinstance(base, type) and issubclass(base, Exception) and base is not Exception:
        bases = (StudentError, base)
    cls = _ERROR_TYPES.get((name, bases[-1].__name__))
    if cls is None:
        try:
            cls = type(name, bases, {})
        except TypeError:  # a built-in exception whose layout cannot be mixed in
            cls = type(name, (StudentError,), {})
        _ERROR_TYPES[(name, bases[-1].__name__)] = cls
    error = cls(message)
    error.where = str(info.get("where", ""))
    error.line = str(info.get("line", ""))
    return error


class Remote:
    """Stands in for an object of the student's process (a function, a class, an instance, a parameter)."""

    __slots__ = ("_session", "_ref", "_info", "__weakref__")

    def __init__(self, session: Session, info: dict) -> None:
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_ref", int(info["ref"]))
        object.__setattr__(self, "_info", info)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.request("call", target=self._ref, args=args, kwargs=kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._session.request("getattr", target=self._ref, name=name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._session.request("setattr", target=self._ref, name=name, value=value)

    @property
    def __name__(self) -> str:  # noqa: PLW3201
        return str(self._info.get("name") or self._info.get("type", "object").rpartition(":")[2])

    @property
    def __class__(self) -> type:  # noqa: PLW3201 - isinstance(proxy, torch.nn.Linear) answers as for the object
        return self._session.framework_class(self._info) or Remote

    def __repr__(self) -> str:
        return f"<{self._info.get('type', 'object').replace(':', '.')} in the student's process>"

    def __bool__(self) -> bool:
        return True


def _remote_name(remote: Remote) -> str:
    return str(remote.__name__)


def _remote_gradients(remote: Remote, args: tuple, upstream: Any, index: int | None, framework: str
                      ) -> tuple[Any, list, str]:
    return object.__getattribute__(remote, "_session").grad(remote, args, upstream, index, framework=framework)


register_proxy(Remote, _remote_name, _remote_gradients)


def _framework_class(name: str) -> type | None:
    module_name, _, qualname = name.partition(":")
    if not module_name.startswith(("torch.", "keras.", "tensorflow.")) and module_name not in ("torch", "keras"):
        return None
    module = sys.modules.get(module_name)
    value: Any = module
    for part in qualname.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, type) else None


class Session:
    """Requests to one student process, each answered before ``deadline`` (``time.monotonic``)."""

    def __init__(self, child: Child, output_limit: int = 4000) -> None:
        self.child = child
        self.reader = P.Reader(child.from_child)
        self.deadline: float | None = None
        self.output_limit = output_limit
        self.remotes: dict[int, Remote] = {}
        self.callbacks: dict[int, Any] = {}
        self.callback_ids: dict[int, int] = {}
        self.output: list[str] = []
        self.output_chars = 0
        self.shortcuts: list[str] = []
        self.monitoring_off = False
        self.calls = 0
        self.abandoned = False

    # -- values -------------------------------------------------------------------------------------------------

    def _other(self, value: Any) -> dict:
        if type(value) is Remote:
            if object.__getattribute__(value, "_session") is not self:
                raise ValueError("an object of another notebook's process")
            return {"ref": object.__getattribute__(value, "_ref")}
        number = self.callback_ids.get(id(value))
        if number is None or self.callbacks.get(number) is not value:
            number = len(self.callbacks) + 1
            self.callbacks[number] = value
            self.callback_ids[id(value)] = number
        return {"cb": number, "type": type(value).__name__, "callable": callable(value)}

    def _resolve(self, node: dict) -> Any:
        if "cb" in node:
            if node["cb"] not in self.callbacks:
                raise P.ProtocolError("an unknown callback")
            return self.callbacks[node["cb"]]
        ref = node["ref"]
        if not isinstance(ref, int):
            raise P.ProtocolError("a handle that is not a number")
        remote = self.remotes.get(ref)
        if remote is None:
            info = {k: node.get(k) for k in ("ref", "type", "mro", "callable", "name")}
            if not isinstance(info.get("mro"), list):
                info["mro"] = []
            info["type"] = str(info.get("type") or "object")
            remote = self.remotes[ref] = Remote(self, info)
        return remote

    def framework_class(self, info: dict) -> type | None:
        for name in info.get("mro") or []:
            cls = _framework_class(str(name))
            if cls is not None:
                return cls
        return None

    # -- requests -----------------------------------------------------------------------------------------------

    def send(self, header: dict, buffers: list[bytes] | None = None) -> None:
        self._refuse_if_abandoned()
        try:
            P.write_message(self.child.to_child, header, buffers)
        except P.ChannelClosed:
            self._refuse_if_abandoned()
            raise SandboxLost("crash", self.child.exit_description()) from None

    def receive(self) -> tuple[dict, list[bytes]]:
        self._refuse_if_abandoned()
        try:
            return self.reader.read(self.deadline)
        except P.ChannelTimeout:
            raise SandboxLost("timeout", "time limit") from None
        except P.ChannelClosed:
            self._refuse_if_abandoned()  # no question to the zygote from a thread that was given up
            raise SandboxLost("crash", self.child.exit_description()) from None
        except P.ProtocolError as error:
            raise SandboxLost("protocol", str(error)) from None

    def _refuse_if_abandoned(self) -> None:
        if self.abandoned:
            raise SandboxLost("timeout", "the check was given up")

    def abandon(self) -> None:
        """The check using this session stalled in this process and its thread is left behind (see
        :func:`companion.grade.steps._watched_check`): its requests fail from now on. Its pipes are pointed at
        ``/dev/null`` and never closed, so a pipe made later for another notebook cannot get their numbers while
        that thread may still write to or read from them."""
        self.abandoned = True
        child = self.child
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in (child.to_child, child.from_child):
                if fd >= 0:
                    os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        child.to_child = child.from_child = -1  # Child.kill / Forked.kill leave them open

    def raw(self, op: str, **fields: Any) -> tuple[dict, list[bytes]]:
        """Send one request with plain JSON fields; return the reply (serving callbacks meanwhile)."""
        self.send({"op": op, "output_limit": self.output_limit, **fields})
        return self.wait_reply()

    def wait_reply(self) -> tuple[dict, list[bytes]]:
        """The reply to the request sent last (or the ``ready`` of ``hello``), serving callbacks meanwhile."""
        while True:
            message, data = self.receive()
            if message.get("reply") is True:
                self._collect(message)
                return message, data
            op = message.get("op")
            if op not in ("cb_call", "cb_getattr"):
                raise SandboxLost("protocol", f"an unexpected message {str(op)[:40]!r}")
            try:
                self.serve_callback(message, data)
            except P.ProtocolError as error:
                raise SandboxLost("protocol", str(error)) from None

    def _collect(self, message: dict) -> None:
        text = message.get("output")
        if isinstance(text, str) and text:
            kept = sum(len(part) for part in self.output)
            if kept < self.output_limit:
                self.output.append(text[: self.output_limit - kept])
        chars = message.get("output_chars")
        if isinstance(chars, int) and chars > 0:
            self.output_chars += chars
        shortcuts = message.get("shortcuts")
        if isinstance(shortcuts, list):
            self.shortcuts += [str(s)[:200] for s in shortcuts[:50]]
        if message.get("monitoring_off"):
            self.monitoring_off = True

    def request(self, op: str, **fields: Any) -> Any:
        """A request whose fields may hold any values (encoded); return the decoded ``value`` of the reply."""
        buffers: list[bytes] = []
        header: dict[str, Any] = {"op": op, "output_limit": self.output_limit}
        for key, value in fields.items():
            header[key] = value if key in ("target", "name") else P.encode(value, buffers, self._other)
        self.calls += 1
        self.send(header, buffers)
        reply, data = self.wait_reply()
        return self.value(reply, data)

    def value(self, reply: dict, data: list[bytes]) -> Any:
        if "error" in reply:
            info = reply["error"] if isinstance(reply["error"], dict) else {"message": str(reply["error"])}
            raise rebuild_error(info)
        try:
            return P.decode(reply.get("value"), data, self._resolve)
        except P.ProtocolError as error:
            raise SandboxLost("protocol", str(error)) from None

    def decode(self, tree: Any, data: list[bytes]) -> Any:
        try:
            return P.decode(tree, data, self._resolve)
        except P.ProtocolError as error:
            raise SandboxLost("protocol", str(error)) from None

    def serve_callback(self, message: dict, data: list[bytes]) -> None:
        """Run one of the checker's objects for the student's code; reply with data or an error."""
        buffers: list[bytes] = []
        try:
            target = self.callbacks.get(message.get("target"))
            if target is None:
                raise P.ProtocolError("an unknown callback")
            if message["op"] == "cb_getattr":
                name = str(message.get("name", ""))
                if name.startswith("_"):
                    raise AttributeError(f"{type(target).__name__} has no public attribute {name!r}")
                result = getattr(target, name)
            else:
                args = P.decode(message.get("args", {"tuple": []}), data, self._resolve)
                kwargs = P.decode(message.get("kwargs", {"dict": []}), data, self._resolve)
                if not isinstance(args, tuple) or not isinstance(kwargs, dict):
                    raise P.ProtocolError("a call without arguments")
                result = target(*args, **{str(k): v for k, v in kwargs.items()})
            reply = {"reply": True, "value": P.encode(result, buffers, self._other)}
        except (P.ProtocolError, SandboxLost):
            raise
        except Exception as error:  # the checker's object refused the student's input, e.g. a ValueError
            buffers = []
            reply = {"reply": True, "error": {"type": type(error).__name__, "message": str(error)[:2000]}}
        self.send(reply, buffers)

    def grad(self, remote: Remote, args: tuple, upstream: Any, index: int | None = None,
             framework: str = "torch") -> tuple[Any, list, str]:
        """Call ``remote`` on ``args`` (float tensors get ``requires_grad``) and back-propagate ``upstream``.

        ``framework`` is ``torch`` (autograd) or ``keras`` (the active backend's autodiff).
        Returns (the result, the gradient of each argument or None, why there are none).
        """
        if framework not in ("torch", "keras"):
            raise ValueError(f"framework must be 'torch' or 'keras'; got {framework!r}")
        buffers: list[bytes] = []
        header = {"op": "grad", "output_limit": self.output_limit, "target": object.__getattribute__(remote, "_ref"),
                  "args": P.encode(tuple(args), buffers, self._other), "kwargs": {"dict": []},
                  "upstream": P.encode(upstream, buffers, self._other), "index": index, "framework": framework}
        self.calls += 1
        self.send(header, buffers)
        reply, data = self.wait_reply()
        result = self.value(reply, data)
        if not reply.get("differentiable"):
            return result, [None] * len(args), str(reply.get("why", ""))
        grads = self.decode(reply.get("grads"), data)
        if not isinstance(grads, dict):
            raise SandboxLost("protocol", "gradients that are not a dictionary")
        return result, [grads.get(str(i)) for i in range(len(args))], ""

    # -- steps --------------------------------------------------------------------------------------------------

    def start_step(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.output, self.output_chars, self.shortcuts, self.monitoring_off = [], 0, [], False

    def output_text(self) -> str:
        return "".join(self.output)

    def close(self) -> None:
        self.child.kill()
