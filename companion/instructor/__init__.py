"""The instructor's tools, never shipped to students: the release leaves this folder out whole.

- ``release``: writes the student edition of the course (``make release DEST=...``);
- ``exercises``: generates ``exercises/`` from ``solutions/`` (``make exercises``);
- ``synthetic`` and ``mutant_source``: build classes of synthetic students for the class grader's tests and
  benchmark.

Nothing outside this folder imports it (``tests/test_package_layout.py``).
"""
