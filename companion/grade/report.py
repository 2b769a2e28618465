"""The grader's reports: a plain-text table for people, JUnit XML and JSON for CI systems."""

from __future__ import annotations

import json
import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from .results import FAILED, PASSED, SKIPPED, GradeReport, NotebookResult

_LABELS = {PASSED: "pass", FAILED: "FAIL", SKIPPED: "skip"}
JSON_VERSION = 1


def notebook_table(notebook: NotebookResult) -> str:
    """One notebook: a header line, a row per exercise (exercise, track, result, message), then its problems."""
    lines = []
    if notebook.error and not notebook.exercises:
        return f"{notebook.path}: ERROR: {notebook.error}\n"
    graded = notebook.count(PASSED) + notebook.count(FAILED)
    lines.append(f"{notebook.path}: {notebook.count(PASSED)} of {graded} passed "
                 f"(chapter {notebook.chapter}, {notebook.seconds:.1f} s)" if notebook.exercises else
                 f"{notebook.path}: nothing graded")
    if notebook.error:
        lines.append(f"  ERROR: {notebook.error}")
    rows = [("exercise", "track", "result", "message")]
    for r in notebook.exercises:
        message = "the notebook could not be graded (see above)" if notebook.error and r.message == notebook.error \
            else r.message
        rows.append((r.id, r.track, _LABELS.get(r.status, r.status), message))
    if notebook.exercises:
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        indent = 2 + sum(widths) + 2 * 3
        for row in rows:
            message = row[3].replace("\n", "\n" + " " * indent)
            cells = "  ".join(value.ljust(width) for value, width in zip(row[:3], widths, strict=True))
            lines.append(f"  {cells}  {message}".rstrip())
    if notebook.problems:
        lines.append("  notebook problems:")
        lines += [f"  - {problem}" for problem in notebook.problems]
    return "\n".join(lines) + "\n"


def summary(report: GradeReport) -> str:
    """The total line."""
    count = len(report.notebooks)
    parts = [f"{report.count(PASSED)} of {report.graded} exercises passed"]
    if report.count(FAILED):
        parts.append(f"{report.count(FAILED)} failed")
    if report.count(SKIPPED):
        parts.append(f"{report.count(SKIPPED)} skipped")
    errors = sum(bool(n.error) for n in report.notebooks)
    if errors:
        parts.append(f"{errors} of the notebooks could not be graded")
    missing = [n.chapter for n in report.notebooks if n.missing]
    if missing:
        parts.append(f"{len(missing)} missing notebook{'s' if len(missing) != 1 else ''} ({', '.join(missing)})")
    verdict = "OK" if report.ok else ("NOTHING GRADED" if report.graded == 0 else "FAILED")
    notebooks = f"{count} notebook{'s' if count != 1 else ''}"
    sandbox = f"sandbox: {report.sandbox}\n" if report.sandbox else ""
    return f"{sandbox}Total ({notebooks}, {report.seconds:.1f} s): {', '.join(parts)}: {verdict}"


def table(report: GradeReport) -> str:
    """Every notebook's table and the total."""
    return "\n".join(notebook_table(n) for n in report.notebooks) + "\n" + summary(report) + "\n"


def junit_xml(report: GradeReport) -> ET.ElementTree:
    """JUnit XML: a testsuite per notebook, a testcase per exercise, a failure element with the message."""
    root = ET.Element("testsuites", name="companion.grade")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for notebook in report.notebooks:
        suite = ET.SubElement(root, "testsuite", name=notebook.chapter, file=notebook.path,
                              time=f"{notebook.seconds:.3f}")
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if notebook.problems:
            properties = ET.SubElement(suite, "properties")
            for problem in notebook.problems:
                ET.SubElement(properties, "property", name="problem", value=problem)
        for result in notebook.exercises:
            case = ET.SubElement(suite, "testcase", classname=notebook.chapter, name=result.id,
                                 file=notebook.path, time=f"{result.seconds:.3f}")
            counts["tests"] += 1
            if result.status == FAILED:
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", message=result.message.splitlines()[0] if result.message
                                        else result.reason, type=result.reason)
                failure.text = result.message
            elif result.status == SKIPPED:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=result.message)
            if result.output:
                cut = result.output_chars - len(result.output)
                out = ET.SubElement(case, "system-out")
                out.text = result.output + (f"\n[... {cut} more characters not kept]" if cut > 0 else "")
        if notebook.error and not notebook.exercises:
            case = ET.SubElement(suite, "testcase", classname=notebook.chapter, name="(notebook)", file=notebook.path)
            counts["tests"] += 1
            counts["errors"] += 1
            ET.SubElement(case, "error", message=notebook.error, type="notebook").text = notebook.error
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{report.seconds:.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write a whole file or nothing: a temporary file in the same folder, then renamed over ``path``."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def write_junit(report: GradeReport, path: str | Path) -> None:
    root = junit_xml(report).getroot()
    write_atomic(path, ET.tostring(root, encoding="utf-8", xml_declaration=True))


def write_json(report: GradeReport, path: str | Path) -> None:
    data = {"version": JSON_VERSION, **report.to_dict()}
    write_atomic(path, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
