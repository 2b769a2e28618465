"""These notebooks are broken on purpose (tests/test_grader.py grades them): pytest must not collect them."""

collect_ignore_glob = ["*"]
