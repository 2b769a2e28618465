"""Exercise checks shared by the notebooks (immediate feedback) and the grader (``python -m companion.grade``).

Each chapter has a module ``companion.checks.chNN`` whose checker functions are registered with
:func:`exercise`. A checker receives the student's object (a function or a class), calls it on seeded random
inputs of several shapes, compares with the companion's reference and raises :class:`CheckFailed` (an
``AssertionError``) with a message that names the likely mistake. The list of chapters is the registry's: a new
module ``chNN.py`` counts as a chapter the grader expects, with no other registration.

In a notebook::

    from companion.checks import check
    check("pad_batch", pad_batch)

**How to write a checker.** ::

    from companion.checks import call, exercise, expect_close, rng, to_numpy
    from companion.checks.tracks import converter, expect_type, tolerance

    @exercise("08_chapter", "my_layer_torch", "what it computes, in a few words", track="torch",
              shortcuts=("torch.nn.functional.scaled_dot_product_attention",))
    def check_my_layer_torch(my_layer_torch) -> None:
        generator = rng(80)
        for batch, length in [(2, 5), (1, 1), (3, 7)]:       # vary every argument the exercise takes
            x = generator.standard_normal((batch, length, 8)).astype(np.float32)
            result = call(my_layer_torch, *converter("torch")(x), pad_id=3)
            expect_close(result, expected_of(x), f"my_layer_torch(x {x.shape})",
                         mistakes={"the likely mistake, in words": wrong_of(x)}, **tolerance("torch"))
            expect_type(result, "torch", "the result of my_layer_torch", "float")

In the notebook the checker gets the student's real object. In the grader it gets a **proxy** of it: the
student's code runs in another, sandboxed process and the checker stays in the trusted one. A checker written as
above works in both, because the proxy supports exactly this:

- **calling** it (``answer(*args, **kwargs)``, or ``call(answer, ...)``, which also turns the student's exception
  into a message with its line): the arguments may be ``None``, numbers, strings, lists, tuples, dicts, sets,
  NumPy arrays and scalars, torch tensors and Keras tensors (sent as data, with dtype and ``requires_grad``), other
  proxies, and any other object of the checker's (a scripted model, a ``torch.nn.LayerNorm``, a lambda): those
  stay in the trusted process and the student's code calls them back (public attributes and calls only);
- the **result** comes back as the same kind of data (a list stays a list, a NumPy array an array, a tensor a
  tensor of its dtype; ``torch.Size`` and named tuples become tuples) or, for anything else (an instance of the
  student's class, a layer, a ``torch.nn.Parameter``, a Keras variable), as another proxy;
- **reading and setting attributes** (``layer.wq``, ``layer.wq.weight.shape``, ``layer.wq.weight.copy_(w)``,
  ``dense.kernel.assign(w)``; ``copy_`` on a parameter runs without autograd), and ``isinstance(proxy,
  torch.nn.Linear)``, ``keras.layers.Dense``, ... for framework classes; ``__name__`` is the student's name;
- **gradients** through :func:`companion.checks.tracks.torch_gradients` and, for Keras answers,
  :func:`companion.checks.tracks.keras_gradients` (the backend's autodiff: ``tf.GradientTape``, torch autograd or
  ``jax.vjp``), or :func:`companion.checks.tracks.expect_differentiable` for either track (not ``.backward()`` on a
  result, which is a copy: the backward pass must run where the graph is);
- **nothing else**: no ``len()``, iteration, arithmetic or comparison on a proxy itself (call it, or read its
  attributes, and work on the data that comes back), no module-level state shared with the student's code, no
  access to the student's globals. Objects passed in are copies: a checker that needs the student's code to see
  a change must pass the object again.

:func:`expect_type` failures are deferred (:func:`defer`) until the checker's value comparisons are done, so a
known mistake is named before a type problem. Wherever an exercise's text names the type of a plain answer (an
int, a float, a tuple, a list, a dict, a string), the checker calls
:func:`companion.checks.tracks.expect_answer_type`: one rule for every chapter, stated once in the conventions of
chapter 1's exercises (``ANSWER_TYPE_RULE``). ``tests/test_grader.py`` grades every solution and every stub
through the grader, which shows at once whether a new checker works through the proxy.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import pkgutil
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

TRACKS = ("numpy", "torch", "keras")


class CheckFailed(AssertionError):
    """A wrong answer, with a message meant for the student."""


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: the student defines ``symbol`` in the notebook ``chapter``."""

    id: str
    chapter: str
    symbol: str
    track: str
    title: str
    checker: Callable[[Any], None]
    #: Calls that answer the exercise in one go (dotted names); reaching one fails the exercise.
    shortcuts: tuple[str, ...] = ()


_REGISTRY: dict[str, Exercise] = {}


def exercise(
    chapter: str, symbol: str, title: str, track: str = "numpy", shortcuts: tuple[str, ...] = ()
) -> Callable:
    """Register the decorated checker for the exercise whose answer is named ``symbol``.

    The exercise id is ``symbol``; it must be unique across the course. ``shortcuts`` names the calls that would
    answer the exercise in one go (``"torch.nn.functional.scaled_dot_product_attention"``): the grader fails an
    answer that reaches one, directly or through the notebook's helpers. The course's own package (anything of
    ``companion`` but ``companion.checks.check``) is always forbidden.
    """
    if track not in TRACKS:
        raise ValueError(f"track must be one of {TRACKS}; got {track!r}")

    def register(checker: Callable[[Any], None]) -> Callable[[Any], None]:
        if symbol in _REGISTRY and _REGISTRY[symbol].checker.__qualname__ != checker.__qualname__:
            raise ValueError(f"exercise id {symbol!r} is registered twice")

        @functools.wraps(checker)
        def checked(answer: Any) -> None:
            token, parts_token = _DEFERRED.set([]), _PARTS.set(([], []))
            try:
                checker(answer)
                pending = _DEFERRED.get()
                parts, failures = _PARTS.get()  # type: ignore[misc]
            finally:
                _DEFERRED.reset(token)
                _PARTS.reset(parts_token)
            if failures:
                failure = failures[0]
                if not pending:  # every part ran and only parts failed: what each part gave can be counted
                    failure.parts = tuple(parts)
                raise failure
            if pending:
                raise pending[0]

        _REGISTRY[symbol] = Exercise(symbol, chapter, symbol, track, title, checked, tuple(shortcuts))
        return checker

    return register


_IMPORT_ERRORS: dict[str, str] = {}
_REGISTRY_LOCK = threading.RLock()  # re-entrant: a chapter module may ask for the registry while it is imported
#: Failures that wait until every value has been compared (see :func:`defer`).
_DEFERRED: contextvars.ContextVar[list | None] = contextvars.ContextVar("deferred", default=None)


#: The parts of the running checker (see :func:`part`): (name, passed) in the order they ran, and their failures.
_PARTS: contextvars.ContextVar[tuple[list, list] | None] = contextvars.ContextVar("parts", default=None)


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """A named part of the running checker, for partial credit: ``with part("masked rows"): ...``.

    A failure (``AssertionError``, so :class:`CheckFailed` too) inside the block fails this part only: the checker
    goes on with its next part, and once it has returned the first part's failure is raised, so the exercise
    fails with the message it would have failed with at once. That failure carries ``parts``: every part's name
    and whether it passed, which the grader turns into a fraction of the points where the instructor allows
    partial credit. The parts are whatever the checker's own code runs: an answer cannot add, remove or rename
    one, and any other way of failing (an exception of the answer's outside ``call``, a time-out, a crash, a
    failure outside every part, a deferred type failure) earns no partial credit. Outside a registered checker the
    block runs as it is.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string; got {name!r}")
    state = _PARTS.get()
    if state is None:
        yield
        return
    parts, failures = state
    try:
        yield
    except AssertionError as failure:
        parts.append((name, False))
        failures.append(failure if isinstance(failure, CheckFailed) else CheckFailed(str(failure)))
    else:
        parts.append((name, True))


def defer(failure: CheckFailed) -> None:
    """Report ``failure`` after the checker's other comparisons, so that a named mistake is reported first.

    Outside a registered checker it is raised at once.
    """
    pending = _DEFERRED.get()
    if pending is None:
        raise failure
    pending.append(failure)


def registry() -> dict[str, Exercise]:
    """Every exercise of the course, by id (imports all chapter modules on first use).

    A chapter module that fails to import is left out (see :func:`import_errors`), so that one broken chapter
    does not stop the checks of the others.
    """
    # One thread at a time: another thread would see a chapter module half imported (in sys.modules, its checks
    # not yet registered) and return a registry without that chapter.
    with _REGISTRY_LOCK:
        for module in pkgutil.iter_modules(__path__):
            name = f"{__name__}.{module.name}"
            if module.name.startswith("ch") and name not in sys.modules and name not in _IMPORT_ERRORS:
                try:
                    importlib.import_module(name)
                except Exception as error:
                    _IMPORT_ERRORS[name] = f"{type(error).__name__}: {error}"
        return dict(_REGISTRY)


def import_errors() -> dict[str, str]:
    """Chapter check modules that failed to import, with the error."""
    registry()
    return dict(_IMPORT_ERRORS)


def exercises_for(chapter: str) -> list[Exercise]:
    """The exercises of one notebook, in the order they were registered."""
    return [e for e in registry().values() if e.chapter == chapter]


def run_check(exercise_id: str, obj: Any) -> None:
    """Run one check; raise CheckFailed with a student-facing message on any problem."""
    exercises = registry()
    if exercise_id not in exercises:
        broken = "".join(f"; {name} failed to import ({error})" for name, error in _IMPORT_ERRORS.items())
        raise KeyError(f"no exercise called {exercise_id!r}; known: {', '.join(sorted(exercises))}{broken}")
    if obj is None:
        raise CheckFailed(f"{exercise_id}: nothing to check: define `{exercise_id}` first")
    try:
        exercises[exercise_id].checker(obj)
    except CheckFailed as failure:
        raise CheckFailed(f"{exercise_id}: {failure}") from None
    except NotImplementedError:
        raise CheckFailed(f"{exercise_id}: not implemented yet (replace the `raise NotImplementedError`)") from None


def check(exercise_id: str, obj: Any) -> None:
    """Check a student's answer inside a notebook: prints a tick or raises CheckFailed with a hint."""
    run_check(exercise_id, obj)
    print(f"✓ {exercise_id}: passed ({registry()[exercise_id].title})")


# ---------------------------------------------------------------------------------------------------------------
# Helpers for writing checkers
# ---------------------------------------------------------------------------------------------------------------


def call(fn: Callable, *args, **kwargs) -> Any:
    """Call the student's code; turn any exception but NotImplementedError into a readable CheckFailed."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except CheckFailed:
        raise
    except Exception as error:  # the student's bug, reported rather than crashing the check
        name = getattr(fn, "__name__", type(fn).__name__)
        where = getattr(error, "where", "") or _student_line(error)
        inputs = describe_inputs(args, kwargs)
        raise CheckFailed(f"calling {name}({inputs}) raised {type(error).__name__}: {error}"
                          + (f" (at {where})" if where else "")) from None


def _student_line(error: BaseException) -> str:
    """The innermost line of a notebook's code in a traceback (when the check runs inside the notebook)."""
    import traceback

    where = ""
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename.startswith(("<ipython-input", "<string", "<notebook")) or "/ipykernel_" in frame.filename:
            where = f"line {frame.lineno}"
    return where


def describe_inputs(args: tuple, kwargs: dict | None = None) -> str:
    """A short description of a call's inputs: shapes and dtypes of arrays, values of small plain data."""
    parts = [_describe_value(a) for a in args]
    parts += [f"{k}={_describe_value(v)}" for k, v in (kwargs or {}).items()]
    return ", ".join(parts)


def _describe_value(value: Any) -> str:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not callable(shape):
        kind = "array" if isinstance(value, np.ndarray) else "tensor"
        return f"{kind} {tuple(shape)} {str(dtype).replace('torch.', '')}"
    if type(value) in (int, float, bool, str, type(None)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if type(value) in (list, tuple, dict) and len(repr(value)) <= 60:
        return repr(value)
    if type(value) in (list, tuple):
        return f"{type(value).__name__} of {len(value)}"
    return getattr(value, "__name__", None) or type(value).__name__


def to_numpy(value: Any) -> np.ndarray:
    """Convert a NumPy array, list, torch tensor or Keras/TensorFlow tensor to a plain NumPy array.

    The result is always a base ``np.ndarray`` of numbers (or strings): an ndarray subclass or an object that
    overrides comparisons cannot fool the checks, and an array of Python objects is refused.
    """
    try:
        if hasattr(value, "detach"):  # torch
            value = value.detach().cpu().numpy()
        elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # TensorFlow eager tensor
            value = value.numpy()
        array = np.array(value, copy=True, subok=False)
    except Exception as error:
        raise CheckFailed(f"expected an array or tensor; got {type_name(value)} ({error})") from None
    if array.dtype.kind in "OV":
        raise CheckFailed(f"expected an array of numbers; got {type_name(value)} holding Python objects")
    return array


@dataclass(frozen=True)
class ProxyHooks:
    """What the checks need of a grader's proxy type (see :func:`register_proxy`)."""

    name: Callable[[Any], str]
    gradients: Callable[[Any, tuple, Any, int | None, str], tuple[Any, list, str]]


_PROXIES: dict[type, ProxyHooks] = {}


def register_proxy(proxy_type: type, name: Callable[[Any], str],
                   gradients: Callable[[Any, tuple, Any, int | None, str], tuple[Any, list, str]]) -> None:
    """Make the checks recognise ``proxy_type``, a grader's stand-in for an object of the student's process.

    ``name(proxy)`` is the name shown for its type (:func:`type_name`); ``gradients(proxy, args, upstream, index,
    framework)`` runs the backward pass where the student's object lives (``framework`` is ``"torch"`` or
    ``"keras"``) and returns what :func:`companion.checks.tracks.torch_gradients` returns. The grader registers
    its proxy when it is imported (:mod:`companion.grade.remote`).
    """
    if not isinstance(proxy_type, type):
        raise ValueError(f"proxy_type must be a class; got {proxy_type!r}")
    _PROXIES[proxy_type] = ProxyHooks(name, gradients)


def proxy_hooks(value: Any) -> ProxyHooks | None:
    """The hooks of ``value``'s proxy type (its real type: a proxy may answer ``__class__`` as another), or None."""
    return _PROXIES.get(type(value))


def type_name(value: Any) -> str:
    """The name of a value's type; for an object of the student's process (a grader proxy), its own type."""
    hooks = proxy_hooks(value)
    if hooks is not None:
        return hooks.name(value)
    return type(value).__name__


def expect_shape(actual: np.ndarray, shape: tuple, what: str) -> None:
    if tuple(actual.shape) != tuple(shape):
        raise CheckFailed(f"{what} should have shape {tuple(shape)}; got {tuple(actual.shape)}")


def expect_close(
    actual: Any,
    expected: np.ndarray,
    what: str,
    mistakes: dict[str, np.ndarray] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """Compare with the reference; when the answer matches a known wrong variant, say which mistake it is.

    Args:
        actual: the student's output.
        expected: the right answer.
        what: how to name the output in messages, e.g. "pad_batch(batch, 5)".
        mistakes: message -> the output that this mistake would produce.
    """
    actual = to_numpy(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        for message, wrong in (mistakes or {}).items():
            if np.shape(wrong) == actual.shape and np.allclose(actual, wrong, atol=atol, rtol=rtol):
                raise CheckFailed(f"{what} has shape {actual.shape}, expected {expected.shape}. Likely: {message}")
        raise CheckFailed(f"{what} should have shape {expected.shape}; got {actual.shape}")
    if actual.dtype.kind == "f" and not np.isfinite(actual[np.isfinite(expected)]).all():
        raise CheckFailed(f"{what} contains NaN or infinity where the answer is finite")
    if np.allclose(actual, expected, atol=atol, rtol=rtol):
        return
    for message, wrong in (mistakes or {}).items():
        if np.shape(wrong) == actual.shape and np.allclose(actual, wrong, atol=atol, rtol=rtol):
            raise CheckFailed(f"{what} is not right. Likely: {message}")
    difference = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    difference = np.where(np.isnan(difference), np.inf, difference)
    index = np.unravel_index(int(np.argmax(difference)), difference.shape) if difference.ndim else ()
    error = float(difference[index]) if difference.size else 0.0
    at = f" at index {tuple(int(i) for i in index)}" if index else ""
    raise CheckFailed(f"{what} differs from the expected values (largest difference {error:.3g}{at}: got "
                      f"{_number(actual[index])}, expected {_number(expected[index])})")


def _number(value: Any) -> str:
    """A number as a person writes it: 43, 0.125, True (never np.int64(43))."""
    item = value.item() if hasattr(value, "item") else value
    return f"{item:.6g}" if isinstance(item, float) else repr(item)


def expect_equal(actual: Any, expected: Any, what: str, mistakes: dict[str, Any] | None = None) -> None:
    """Exact comparison for integers, lists and dictionaries; names a known mistake when it matches one.

    The student's value is first turned into plain Python values (``int``, ``float``, ``str``, lists, dicts), so
    an object whose ``==`` always answers True cannot pass.
    """
    normal = _normalise(actual, strict=True)
    if normal == _normalise(expected):
        return
    for message, wrong in (mistakes or {}).items():
        if normal == _normalise(wrong):
            raise CheckFailed(f"{what} is not right. Likely: {message}")
    raise CheckFailed(f"{what} should be {_short(expected)}; got {_short(actual)}")


_PLAIN = (str, int, float, bool, complex, bytes, type(None))


def _normalise(value: Any, strict: bool = False) -> Any:
    """Plain Python values for comparison: tuples become lists, arrays and tensors become nested lists.

    With ``strict`` (for the student's values), only the exact built-in types are accepted, and containers are
    read through the built-in methods, so a subclass cannot override what is compared.
    """
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        return {_hashable(_normalise(k, strict)): _normalise(v, strict) for k, v in dict.items(value)}
    if isinstance(value, list | tuple):
        items = list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)
        return [_normalise(v, strict) for v in items]
    if isinstance(value, set | frozenset):
        items = set.__iter__(value) if isinstance(value, set) else frozenset.__iter__(value)
        return frozenset(_hashable(_normalise(v, strict)) for v in items)
    if isinstance(value, np.generic):
        return _normalise(value.item(), strict)
    if hasattr(value, "tolist") or hasattr(value, "detach"):
        return _normalise(to_numpy(value).tolist(), strict)
    if strict:
        raise CheckFailed(f"expected plain values (numbers, strings, lists, dicts, arrays); got {type_name(value)}")
    return value


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _hashable(v)) for k, v in value.items()))
    return value


def _short(value: Any, limit: int = 200) -> str:
    try:
        text = repr(_normalise(value))
    except Exception:  # a student's object whose repr fails
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rng(seed: int = 0) -> np.random.Generator:
    """The seeded generator every checker uses, so a verdict never depends on luck."""
    return np.random.default_rng(seed)
