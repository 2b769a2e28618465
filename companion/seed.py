"""The course's seed knob: ``COURSE_SEED`` (an integer, default 0) seeds every page that initialises, trains,
samples or draws random data, so a reader or a test can rerun any page with another seed.

    COURSE_SEED=3 jupyter-book build .        # the whole book with seed 3
    COURSE_SEED=3 jupyter lab                 # the same for the notebooks you open

A page calls ``seed_everything()`` once at the top, and passes ``course_seed()`` (or ``course_seed() + k`` for
the k-th independent draw) wherever a function takes a ``seed`` argument.

A sentence of a page about numbers that depend on the seed (a trained, sampled or timed result) is asserted with
``claim(holds, sentence, printed)``: a failure says what the sentence claims, what this run printed, and which
seed reproduces it. With ``COURSE_CLAIMS_LOG=FILE`` set, claims are appended to FILE (one JSON line each) instead
of raised, so ``benchmarks/claims_by_seed.py`` can tabulate every claim of a page over many seeds.
"""

from __future__ import annotations

import json
import os
import random
import sys

import numpy as np

ENV_VAR = "COURSE_SEED"
CLAIMS_LOG_VAR = "COURSE_CLAIMS_LOG"


def course_seed() -> int:
    """The seed a page uses: the integer in ``COURSE_SEED``, or 0 when it is unset or empty."""
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return 0
    try:
        seed = int(text)
    except ValueError:
        raise ValueError(f"{ENV_VAR} must be a non-negative integer, got {text!r}") from None
    if seed < 0:
        raise ValueError(f"{ENV_VAR} must be a non-negative integer, got {seed}")
    return seed


def seed_everything(offset: int = 0, deterministic: bool = True) -> int:
    """Seed Python's ``random``, NumPy's global generator, and PyTorch and Keras where they are imported, with
    ``course_seed() + offset``; return that seed.

    Frameworks that the page has not imported are left alone (seeding Keras would import TensorFlow). With
    ``deterministic`` (the default), PyTorch is asked for deterministic algorithms (a warning, not an error, where
    an operation has none) and TensorFlow, when it is Keras' backend, for op determinism: the same seed on the same
    machine then gives the same numbers run after run. Other CPUs or GPUs, other library versions and another
    number of threads may still round differently.
    """
    if offset < 0:
        raise ValueError(f"offset must be non-negative, got {offset}")
    seed = course_seed() + offset
    random.seed(seed)
    np.random.seed(seed)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.manual_seed(seed)
        if deterministic:
            # cuBLAS needs a fixed workspace for reproducible matrix products; read when CUDA starts.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
    if "keras" in sys.modules:
        keras = sys.modules["keras"]
        keras.utils.set_random_seed(seed)
        if deterministic and keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            tf.config.experimental.enable_op_determinism()
    return seed


def claim(holds: bool, sentence: str, printed: str) -> None:
    """Assert that ``sentence`` (what the page says about its printed numbers) holds for this run.

    ``printed`` shows the numbers the sentence rests on, as this run printed them. Raises ``AssertionError`` with
    both and the seed that reproduces the run; records instead of raising when ``COURSE_CLAIMS_LOG`` is set.
    """
    log = os.environ.get(CLAIMS_LOG_VAR)
    if log:
        record = {"claim": sentence, "holds": bool(holds), "printed": printed, "seed": course_seed()}
        with open(log, "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
        return
    if not holds:
        raise AssertionError(
            f"The text says: {sentence}\nThis run printed: {printed}\n"
            f"The sentence does not hold for this run; `{ENV_VAR}={course_seed()}` on this machine reproduces it. "
            "Trained and sampled numbers differ between seeds and CPUs: please report the seed and your CPU.")
