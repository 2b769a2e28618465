"""Chapter 9's exercises refuse the libraries that implement them in one call: PyTorch's RMSNorm and fused
attention, Keras Hub's layers, Hugging Face transformers' Llama.

Each forbidden form is written into a notebook as a student would write it. The source scan must name it; one
notebook graded through the sandbox shows the whole path, a name built at run time included (the tripwire).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from companion.checks import exercises_for
from companion.checks.ch09 import KERAS_HUB_SHORTCUTS, TRANSFORMERS_SHORTCUTS
from companion.grade.notebooks import read_cells
from companion.grade.shortcuts import find_shortcuts

CHAPTER = "09_modern_decoder"
DECLARED = {e.id: e.shortcuts for e in exercises_for(CHAPTER)}
LLAMA = "transformers.models.llama.modeling_llama"
FRONT_MATTER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

"""

#: (exercise, the answer's imports and code, the call the scan must name)
FORMS = [
    ("rms_norm", "import torch\n\ndef rms_norm(x, weight, eps):\n"
     "    return torch.nn.RMSNorm(x.shape[-1], eps=eps)(torch.as_tensor(x)).detach().numpy()",
     "torch.nn.RMSNorm"),
    ("rms_norm", "from torch import nn\n\ndef rms_norm(x, weight, eps):\n    return nn.RMSNorm(x.shape[-1], eps)(x)",
     "torch.nn.RMSNorm"),
    ("rms_norm", "import torch.nn.functional as F\n\ndef rms_norm(x, weight, eps):\n"
     "    return F.rms_norm(x, x.shape[-1:], weight, eps)", "torch.nn.functional.rms_norm"),
    ("rms_norm", "import keras_hub\n\ndef rms_norm(x, weight, eps):\n"
     "    return keras_hub.layers.RMSNormalization(epsilon=eps)(x)", "keras_hub.layers.RMSNormalization"),
    ("rms_norm", f"from {LLAMA} import LlamaRMSNorm\n\ndef rms_norm(x, weight, eps):\n"
     "    return LlamaRMSNorm(x.shape[-1], eps)(x)", f"{LLAMA}.LlamaRMSNorm"),
    ("apply_rope", "from keras_hub.layers import RotaryEmbedding\n\ndef apply_rope(x, offset, base):\n"
     "    return RotaryEmbedding(max_wavelength=base)(x, start_index=offset)", "keras_hub.layers.RotaryEmbedding"),
    ("apply_rope", f"from {LLAMA} import apply_rotary_pos_emb\n\ndef apply_rope(x, offset, base):\n"
     "    return apply_rotary_pos_emb(x, x, offset, base)[0]", f"{LLAMA}.apply_rotary_pos_emb"),
    ("rotate_half", f"import {LLAMA} as llama\n\ndef rotate_half(x):\n    return llama.rotate_half(x)",
     f"{LLAMA}.rotate_half"),
    ("expand_kv_heads", f"from {LLAMA} import repeat_kv\n\ndef expand_kv_heads(k, group):\n"
     "    return repeat_kv(k, group)", f"{LLAMA}.repeat_kv"),
    ("swiglu_torch", "from transformers.models.llama import modeling_llama\n\n"
     "def swiglu_torch(x, w1, w2, w3):\n    return modeling_llama.LlamaMLP", f"{LLAMA}.LlamaMLP"),
    ("swiglu_keras", "import keras_hub\n\ndef swiglu_keras(x, w1, w2, w3):\n"
     "    return keras_hub.models.LlamaBackbone", "keras_hub.models"),
    ("window_mask", "from keras_hub import src\n\ndef window_mask(length, window):\n"
     "    return src.layers.modeling.transformer_layer_utils.compute_causal_mask(1, length, length)",
     "keras_hub.src"),
    ("permute_for_half_split", "import transformers\n\ndef permute_for_half_split(w, num_heads):\n"
     "    return transformers.LlamaForCausalLM", "transformers.LlamaForCausalLM"),
    ("gqa_cache_bytes", "import transformers\n\ndef gqa_cache_bytes(*args):\n"
     "    return transformers.models.llama.LlamaConfig().num_key_value_heads", "transformers.models"),
    ("fixed_online_attention", "import torch.nn.functional as F\n\ndef fixed_online_attention(q, k, v, block_size):\n"
     "    return F.scaled_dot_product_attention(q, k, v)", "torch.nn.functional.scaled_dot_product_attention"),
]


def _notebook(folder: Path, code: str) -> Path:
    path = folder / f"{CHAPTER}.md"
    path.write_text(FRONT_MATTER + "```{code-cell} ipython3\n" + code + "\n```\n", encoding="utf-8")
    return path


def _cells(folder: Path, code: str) -> list:
    cells = read_cells(_notebook(folder, code))
    assert len(cells) == 1 and cells[0].tree is not None and not cells[0].problems, "the notebook did not parse"
    return cells


def test_every_exercise_declares_the_libraries_and_the_frameworks_calls():
    assert len(DECLARED) >= 10
    for exercise_id, shortcuts in DECLARED.items():
        assert set(KERAS_HUB_SHORTCUTS + TRANSFORMERS_SHORTCUTS) <= set(shortcuts), exercise_id
    assert {"torch.nn.RMSNorm", "torch.nn.functional.rms_norm"} <= set(DECLARED["rms_norm"])
    assert "torch.nn.functional.scaled_dot_product_attention" in DECLARED["fixed_online_attention"]


@pytest.mark.parametrize("exercise_id, code, name", FORMS, ids=[f"{e}-{n.rpartition('.')[2]}" for e, _, n in FORMS])
def test_the_source_scan_names_each_library_shortcut(tmp_path, exercise_id, code, name):
    cells = _cells(tmp_path, code)
    found = find_shortcuts(cells, exercise_id, DECLARED[exercise_id])
    assert f"`{name}`" in found, found
    assert find_shortcuts(cells, exercise_id, ()) == []  # the declaration is what refuses it


def test_an_own_answer_with_library_like_names_is_not_flagged(tmp_path):
    code = ("import numpy as np\n\ndef rotate_half(x, layers=None):\n    models = np.split(x, 2, axis=-1)\n"
            "    return np.concatenate([-models[1], models[0]], axis=-1)")
    assert find_shortcuts(_cells(tmp_path, code), "rotate_half", DECLARED["rotate_half"]) == []


GRADED = f"""\
import importlib

import numpy as np
import torch
import torch.nn.functional as F
from keras_hub.layers import RotaryEmbedding
from {LLAMA} import repeat_kv

from companion.checks import check


def rms_norm(x, weight, eps):
    out = F.rms_norm(torch.as_tensor(x), x.shape[-1:], torch.as_tensor(weight), eps)
    return out.numpy().astype(x.dtype)


def rotate_half(x):
    module = importlib.import_module("transformers.models.llama." + "modeling_" + "llama")
    return getattr(module, "rotate" + "_half")(torch.as_tensor(x)).numpy()


def apply_rope(x, offset, base):
    return np.asarray(RotaryEmbedding(max_wavelength=base)(x, start_index=offset))


def expand_kv_heads(k, group):
    return repeat_kv(torch.as_tensor(k), group).numpy()


def fixed_online_attention(q, k, v, block_size):
    q, k, v = (torch.as_tensor(a) for a in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v).numpy()
"""


def test_the_grader_fails_each_library_shortcut_with_the_call_named(tmp_path):
    """Through the sandboxed grader: the source scan, and the tripwire for a name built at run time."""
    from companion.grade import FAILED, grade

    folder = tmp_path / "student"
    folder.mkdir()
    _notebook(folder, textwrap.dedent(GRADED))
    report = grade([folder], chapters=["09"], timeout=120)
    results = {r.id: r for r in report.notebooks[0].exercises}
    expected = {
        "rms_norm": "reaches `torch.nn.functional.rms_norm`",
        "rotate_half": f"called `{LLAMA}.rotate_half`",
        "apply_rope": "reaches `keras_hub.layers.RotaryEmbedding`",
        "expand_kv_heads": f"reaches `{LLAMA}.repeat_kv`",
        "fixed_online_attention": "reaches `torch.nn.functional.scaled_dot_product_attention`",
    }
    for exercise_id, words in expected.items():
        result = results[exercise_id]
        assert (result.status, result.reason) == (FAILED, "shortcut"), result
        assert words in result.message and "write it yourself" in result.message, result.message
