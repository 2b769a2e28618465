"""Stale evidence cannot stay in the book: every result file in benchmarks/results/*.json must have been written
by the current version of the code it names."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import evidence  # noqa: E402

FILES = sorted((ROOT / "benchmarks" / "results").glob("*.json"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_result_file_matches_its_code(path):
    data = json.loads(path.read_text())
    provenance = data["provenance"]
    assert provenance["seeds"] and provenance["command"] and provenance["code"], f"{path.name}: incomplete provenance"
    stale = evidence.stale_code(data)
    assert not stale, (f"{path.name} was computed by other code than today's ({', '.join(stale)} changed): "
                       f"rerun `{provenance['command']}` and commit the new file")


def test_a_changed_file_is_seen(tmp_path, monkeypatch):
    code = tmp_path / "model.py"
    code.write_text("x = 1\n")
    monkeypatch.setattr(evidence, "ROOT", tmp_path)
    out = evidence.write_evidence(tmp_path / "r.json", {"mean": 1.0}, seeds=[0, 1], code=["model.py"])
    data = json.loads(out.read_text())
    assert evidence.stale_code(data) == []
    code.write_text('"""A docstring."""\nx = 1  # a comment\n')
    assert evidence.stale_code(data) == []                    # what the code does is the same
    code.write_text("x = 2\n")
    assert evidence.stale_code(data) == ["model.py"]
    page = tmp_path / "page.md"
    page.write_text("text")
    with_data = json.loads(evidence.write_evidence(tmp_path / "d.json", {}, seeds=[0], code=["model.py"],
                                                   data=["page.md"]).read_text())
    page.write_text("other text")
    assert evidence.stale_code(with_data) == [] and "page.md" in with_data["provenance"]["data"]
    with pytest.raises(ValueError, match="seeds"):
        evidence.write_evidence(tmp_path / "r.json", {}, seeds=[], code=["model.py"])


def test_claims_table_names_the_failing_seeds():
    import claims_by_seed

    runs = [{"seed": 0, "claims": [{"claim": "beam helps", "holds": True, "printed": "1 > 0"}], "errors": []},
            {"seed": 1, "claims": [{"claim": "beam helps", "holds": False, "printed": "0 > 1"}],
             "errors": [{"cell": 3, "error": "AssertionError: x"}]}]
    rows, text = claims_by_seed.table(runs)
    assert rows == [{"claim": "beam helps", "fails": [1], "holds": [0], "printed": {"0": "1 > 0", "1": "0 > 1"}}]
    assert "FAILS for seeds [1]" in text and "seed 1, cell 3: AssertionError" in text


NOTEBOOK = """---
jupytext:
  text_representation:
    format_name: myst
kernelspec:
  name: python3
  display_name: Python 3
---

# A chapter

Some prose.

```{code-cell} ipython3
x = 1
```
"""


def test_a_notebook_is_hashed_by_its_code_cells_and_rehash_checks_first(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "ROOT", tmp_path)
    chapter = tmp_path / "chapter.md"
    chapter.write_text(NOTEBOOK)
    data = json.loads(evidence.write_evidence(tmp_path / "r.json", {}, seeds=[0], code=["chapter.md"]).read_text())
    chapter.write_text(NOTEBOOK.replace("Some prose.", "Other prose, same code."))
    assert evidence.stale_code(data) == []
    chapter.write_text(NOTEBOOK.replace("x = 1", "x = 2"))
    assert evidence.stale_code(data) == ["chapter.md"]
    # an old byte-hashed file moves to the current hashing only while its hashes still hold
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"provenance": {"code": evidence.code_hashes(["chapter.md"], "bytes")}, "results": {}}))
    assert evidence.rehash(old) == []
    assert json.loads(old.read_text())["provenance"]["rehashed_from"] == "bytes"
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({"provenance": {"code": {"chapter.md": "0" * 64}}, "results": {}}))
    assert evidence.rehash(stale) == ["chapter.md"] and "rehashed_from" not in stale.read_text()
