"""``companion/torch`` and ``companion/keras`` mirror each other file for file and name for name.

Read with ``ast`` (nothing is imported). Every public function and class must exist in both frameworks with the
same arguments, except the differences listed here, each of which CONTRIBUTING.md's table "Where the frameworks
differ" explains. A new difference, or one that goes away, fails the test until the list and the table follow.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "companion"

#: (kind, file, name): "torch only", "keras only", or "arguments" (same name, other arguments).
DIFFERENCES = {
    ("arguments", "attention.py", "scaled_dot_product_attention"),  # Keras: seed of its dropout
    ("keras only", "decoding.py", "NextTokenLogits"),  # Keras runs the decoder as one compiled call per step
    ("keras only", "decoding.py", "next_token_logits"),
    ("arguments", "distributed.py", "train_data_parallel"),  # model (torch) / make_model (Keras); use_ddp
    ("arguments", "distributed.py", "train_single_process"),
    ("torch only", "distributed.py", "average_gradients"),  # torch sums the gradients itself
    ("torch only", "distributed.py", "lm_loss"),
    ("keras only", "distributed.py", "split_cpu"),  # logical CPU devices for MirroredStrategy
    ("keras only", "distributed.py", "tiny_language_model"),
    ("keras only", "distributed.py", "main"),
    ("torch only", "masking.py", "to_torch_mha_mask"),  # each converts to its own framework's attention layer
    ("keras only", "masking.py", "to_keras_mha_mask"),
    ("arguments", "modern.py", "sliding_window_mask"),  # torch: device
    ("keras only", "text.py", "as_ids"),  # Keras layers take lists and NumPy arrays, and build from shapes
    ("keras only", "text.py", "check_rank"),
    ("keras only", "training.py", "LabelSmoothedCrossEntropy"),  # Keras trains through compile/train_on_batch
    ("keras only", "training.py", "PaperAdam"),
    ("keras only", "training.py", "TeacherForcing"),
    ("keras only", "training.py", "WarmupSchedule"),
    ("arguments", "training.py", "Trainer"),  # Keras: jit_compile
}


def _arguments(node: ast.FunctionDef) -> list[str]:
    return [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]


def public_names(path: Path) -> dict[str, list[str] | None]:
    """Public function or class -> its arguments (a class's ``__init__`` without ``self`` and ``**kwargs``)."""
    found: dict[str, list[str] | None] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
            continue
        if isinstance(node, ast.FunctionDef):
            found[node.name] = _arguments(node)
        else:
            init = next((m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
            found[node.name] = _arguments(init)[1:] if init else None
    return found


def differences() -> set[tuple[str, str, str]]:
    torch_files = {p.name for p in (PACKAGE / "torch").glob("*.py")}
    keras_files = {p.name for p in (PACKAGE / "keras").glob("*.py")}
    found = {("torch only", name, "(file)") for name in torch_files - keras_files}
    found |= {("keras only", name, "(file)") for name in keras_files - torch_files}
    for name in sorted(torch_files & keras_files):
        in_torch = public_names(PACKAGE / "torch" / name)
        in_keras = public_names(PACKAGE / "keras" / name)
        found |= {("torch only", name, f) for f in set(in_torch) - set(in_keras)}
        found |= {("keras only", name, f) for f in set(in_keras) - set(in_torch)}
        found |= {("arguments", name, f) for f in set(in_torch) & set(in_keras) if in_torch[f] != in_keras[f]}
    return found


def test_the_frameworks_differ_only_where_contributing_says():
    assert ("arguments", "model.py", "Transformer") not in differences()
    assert differences() == DIFFERENCES


def test_the_table_of_differences_names_each_one():
    table = (PACKAGE.parent / "CONTRIBUTING.md").read_text(encoding="utf-8").split("### Where the frameworks differ")[1]
    for _, _, name in DIFFERENCES:
        assert f"`{name}" in table, name


def test_every_keras_layer_with_a_mask_argument_keeps_the_mask_to_itself():
    # Keras reads a call argument named `mask` as a per-timestep mask and attaches it to the layer's output; ours
    # are attention masks, used up inside the layer, so such a layer says it returns no mask (compute_mask).
    checked = 0
    for path in (PACKAGE / "keras").glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
            if "call" in methods and "mask" in _arguments(methods["call"]):
                checked += 1
                assert "compute_mask" in methods, f"{path.name}: {node.name}"
    assert checked >= 6
