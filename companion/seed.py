"""The course's seed knob: ``COURSE_SEED`` (an integer, default 0) seeds every page that initialises, trains,
samples or draws random data, so a reader or a test can rerun any page with another seed.

    COURSE_SEED=3 jupyter-book build .        # the whole book with seed 3
    COURSE_SEED=3 jupyter lab                 # the same for the notebooks you open

A page calls ``seed_everything()`` once at the top, and passes ``course_seed()`` (or ``course_seed() + k`` for
the k-th independent draw) wherever a function takes a ``seed`` argument.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np

ENV_VAR = "COURSE_SEED"


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


def seed_everything(offset: int = 0) -> int:
    """Seed Python's ``random``, NumPy's global generator, and PyTorch and Keras where they are imported, with
    ``course_seed() + offset``; return that seed.

    Frameworks that the page has not imported are left alone (seeding Keras would import TensorFlow).
    """
    if offset < 0:
        raise ValueError(f"offset must be non-negative, got {offset}")
    seed = course_seed() + offset
    random.seed(seed)
    np.random.seed(seed)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)
    if "keras" in sys.modules:
        sys.modules["keras"].utils.set_random_seed(seed)
    return seed
