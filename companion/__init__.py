"""Companion package of the course "The Transformer, from text as numbers to a trained model".

Framework-free parts live at the top level (``companion.text``, ``companion.data``, ``companion.checks``, ...).
The same layers exist twice, with the same names and arguments: ``companion.torch`` (PyTorch) and
``companion.keras`` (Keras 3, ``keras.ops`` only). ``companion.reference`` is the NumPy oracle both are tested
against.
"""

import os

# TensorFlow reads these once, at its first import: quiet start-up logs and let torch share a GPU.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

__version__ = "0.1.0"
