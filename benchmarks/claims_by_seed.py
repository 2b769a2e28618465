"""Run a chapter once per seed and tabulate which of its claims hold: the assert-by-seed table.

Every sentence of a chapter about seed-dependent numbers is asserted with ``companion.seed.claim``. This script
executes the chapter (the MyST source, through jupytext and nbclient) once for each ``COURSE_SEED``, with
``COURSE_CLAIMS_LOG`` set so that claims are recorded instead of raised, and also records any cell that fails
(a plain ``assert`` or an error). It prints one row per claim with the seeds where it fails, and writes the table
with its provenance (``benchmarks/evidence.py``) to ``benchmarks/results/claims_<chapter>.json``.

    python benchmarks/claims_by_seed.py notebooks/07_full_model.md --seeds 0 1 2 3 4 5 6 7 8 9 \\
        --code companion/training.py companion/torch companion/keras
    python benchmarks/claims_by_seed.py notebooks/08_gpt.md --seeds 0 1 --jobs 2 --no-write   # a quick look

``--env NAME=VALUE`` adds to the kernels' environment (for example ``ONEDNN_MAX_CPU_ISA=AVX2`` to compute as an
older CPU does); the chapter's own folder is the kernels' working directory, as in the book.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence import RESULTS, ROOT, write_evidence  # noqa: E402


def run_once(source: Path, seed: int, extra_env: dict[str, str], timeout: int) -> dict:
    """Execute ``source`` with ``COURSE_SEED=seed``; return its claims, failed cells and time."""
    import jupytext
    import nbclient

    notebook = jupytext.read(source)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "claims.jsonl"
        env = {**os.environ, **extra_env, "COURSE_SEED": str(seed), "COURSE_CLAIMS_LOG": str(log),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        client = nbclient.NotebookClient(notebook, timeout=timeout, allow_errors=True, kernel_name="python3",
                                         resources={"metadata": {"path": str(source.parent)}})
        start = time.perf_counter()
        client.execute(env=env)  # handed to the kernel manager: the kernel's environment
        seconds = time.perf_counter() - start
        claims = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    errors = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append({"cell": index, "error": f"{output['ename']}: {output['evalue']}"[:500]})
    return {"seed": seed, "seconds": round(seconds, 1), "claims": claims, "errors": errors}


def table(runs: list[dict]) -> tuple[list[dict], str]:
    """One row per claim (in the order of the chapter) with the seeds where it fails; and the printed table."""
    rows: dict[str, dict] = {}
    for run in runs:
        for record in run["claims"]:
            row = rows.setdefault(record["claim"], {"claim": record["claim"], "fails": [], "holds": [],
                                                    "printed": {}})
            (row["holds"] if record["holds"] else row["fails"]).append(run["seed"])
            row["printed"][str(run["seed"])] = record["printed"]
    lines = [f"{len(rows)} claims over seeds {[r['seed'] for r in runs]}"]
    for row in rows.values():
        verdict = "holds for every seed" if not row["fails"] else f"FAILS for seeds {sorted(row['fails'])}"
        lines.append(f"- {row['claim'][:110]}: {verdict}")
    for run in runs:
        for error in run["errors"]:
            lines.append(f"! seed {run['seed']}, cell {error['cell']}: {error['error'][:200]}")
    return list(rows.values()), "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path, help="a chapter's MyST source, e.g. notebooks/07_full_model.md")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--code", nargs="*", default=[], help="files or folders the claims depend on (hashed)")
    parser.add_argument("--data", nargs="*", default=[], help="inputs recorded but not checked (corpus pages)")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE added to the kernels' environment")
    parser.add_argument("--jobs", type=int, default=1, help="chapters executed at once")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    source = args.notebook.resolve()
    if not source.is_file():
        parser.error(f"notebook: no such file {args.notebook}")
    extra_env = dict(item.split("=", 1) for item in args.env)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = list(pool.map(lambda s: run_once(source, s, extra_env, args.timeout), args.seeds))
    rows, text = table(runs)
    print(text)
    for run in runs:
        print(f"seed {run['seed']}: {run['seconds']} s, {len(run['claims'])} claims, {len(run['errors'])} errors")
    if not args.no_write:
        chapter = source.stem.split("_", 1)[0]
        name = "claims_ch" + chapter + ("_" + "_".join(extra_env.values()) if extra_env else "") + ".json"
        out = write_evidence(RESULTS / name, {"env": extra_env, "claims": rows, "runs": runs},
                             seeds=args.seeds, code=[str(source.relative_to(ROOT)), *args.code], data=args.data,
                             notes="claims recorded with companion.seed.claim; errors: cells that failed")
        print(f"wrote {out.relative_to(ROOT)}")
    return 1 if any(row["fails"] for row in rows) or any(run["errors"] for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
