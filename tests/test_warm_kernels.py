"""`make book`'s notebook kernels are forks of one process with the frameworks imported (book/_ext/warm_kernels.py):
as fresh as ordinary kernels in everything a page sees, and gone when the build is."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat
import pytest
from jupyter_client.manager import KernelManager

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import warm_kernels  # noqa: E402

PROBE = """\
import json, os, signal, subprocess, sys
print(json.dumps({"cwd": os.getcwd(), "probe": os.environ.get("WARM_KERNEL_PROBE"), "path": sys.path,
                  "argv0": os.path.basename(sys.argv[0]), "leftover": "leftover" in globals(),
                  "preloaded": "xml.dom.minidom" in sys.modules, "pid": os.getpid(),
                  "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
                  "child": subprocess.run(["echo", "from a child"], capture_output=True, text=True).stdout}))
leftover = 1
"""


def _run(kernel_name: str, cwd: Path) -> dict:
    import json

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PROBE)],
                                        metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                 "display_name": "Python 3"}})
    nbclient.NotebookClient(notebook, kernel_name=kernel_name, timeout=120,
                            resources={"metadata": {"path": str(cwd)}}).execute()
    text = "".join(output.get("text", "") for output in notebook.cells[0].outputs if output.get("name") == "stdout")
    return json.loads(text)


def _gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _commands() -> list[tuple[int, bytes]]:
    commands = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            commands.append((int(pid), Path(f"/proc/{pid}/cmdline").read_bytes()))
        except OSError:                                       # ended while being listed
            pass
    return commands


@pytest.fixture
def zygote(monkeypatch):
    """A zygote that preloads a module no probe imports itself (quick to import, easy to see)."""
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    with warm_kernels.warm_kernels(("xml.dom.minidom",)) as home:
        yield home


def test_a_forked_kernel_sees_what_an_ordinary_kernel_sees(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    monkeypatch.setenv("WARM_KERNEL_PROBE", "before")
    ordinary = _run("python3", tmp_path)
    with warm_kernels.warm_kernels(("xml.dom.minidom",)):
        monkeypatch.setenv("WARM_KERNEL_PROBE", "set after the zygote started")
        forked = _run("python3", tmp_path)                  # the name the notebooks give: the build's spec wins
        again = _run("python3", tmp_path)
    assert forked["preloaded"] and not ordinary["preloaded"]
    for probe in (forked, again):
        assert probe["cwd"] == ordinary["cwd"] == str(tmp_path)
        assert probe["probe"] == "set after the zygote started"       # the environment of the moment it started
        assert probe["path"] == ordinary["path"]
        assert probe["argv0"] == ordinary["argv0"] == "ipykernel_launcher.py"
        assert probe["sigint"] and probe["child"] == "from a child\n"
        assert not probe["leftover"]                                     # nothing of an earlier kernel
    assert forked["pid"] != again["pid"]
    assert _gone(forked["pid"]) and _gone(again["pid"])
    assert ordinary["probe"] == "before" and not ordinary["leftover"]


def test_without_a_zygote_the_kernel_is_an_ordinary_one(tmp_path: Path, monkeypatch) -> None:
    warm_kernels.kernel_spec(tmp_path, str(tmp_path / "no-zygote-here"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    probe = _run("python3", tmp_path)
    assert not probe["preloaded"] and probe["cwd"] == str(tmp_path)


def test_interrupts_reach_the_kernel_and_a_killed_kernel_leaves_nothing(zygote) -> None:
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        printed: list[str] = []
        client.execute_interactive("import os; print(os.getpid())", timeout=60,
                                   output_hook=lambda message: printed.append(message["content"].get("text", "")))
        kernel = int("".join(printed))
        assert kernel != manager.provisioner.process.pid      # jupyter_client watches `connect`; the kernel is a fork
        client.execute("import time; time.sleep(60)")
        time.sleep(1.0)
        manager.interrupt_kernel()                            # SIGINT to `connect`'s group, relayed to the kernel
        reply = client.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)                     # SIGKILL to `connect`: the kernel must follow it
    assert _gone(kernel)


def test_the_zygote_ends_with_the_build(monkeypatch) -> None:
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    with warm_kernels.warm_kernels(("xml.dom.minidom",)):
        home = os.environ["JUPYTER_PATH"]
        zygotes = [pid for pid, command in _commands() if home.encode() in command]
    assert len(zygotes) == 1 and _gone(zygotes[0])
    assert "JUPYTER_PATH" not in os.environ and not Path(home).exists()


def _printed(notebook) -> list[str]:
    """Per code cell, its standard output and the plain text of what it displayed, in order (a printed line may
    arrive in several stream messages, split differently from run to run)."""
    return ["".join(output.get("text", "") if output.get("name") != "stderr" else ""
                    for output in cell.outputs) + "|" +
            "|".join(output.get("data", {}).get("text/plain", "") for output in cell.outputs)
            for cell in notebook.cells if cell.cell_type == "code"]


def test_a_page_prints_and_shows_the_same_in_a_forked_kernel(monkeypatch) -> None:
    """The real preload (Keras imports matplotlib before any kernel exists): the figures are still shown, and a page
    that seeds and draws from Keras prints what a fresh kernel prints."""
    import jupytext

    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    page = jupytext.read(ROOT / "book" / "masks.md")
    page.cells.append(nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2, 4]);"))

    def run() -> nbformat.NotebookNode:
        notebook = nbformat.from_dict(page)
        nbclient.NotebookClient(notebook, kernel_name="python3", timeout=300,
                                resources={"metadata": {"path": str(ROOT / "book")}}).execute()
        return notebook

    fresh = run()
    with warm_kernels.warm_kernels():
        forked = run()
    assert _printed(forked) == _printed(fresh)
    assert "image/png" in forked.cells[-1].outputs[-1]["data"]              # the figure, shown inline
