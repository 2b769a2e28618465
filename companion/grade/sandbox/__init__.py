"""Code that runs inside the grading sandbox, next to the student's definitions.

This package is copied (bound read-only) into the sandbox on its own: it must import nothing from ``companion``
(the rest of the course is not there) and only the standard library, NumPy, and the frameworks it is asked for.
The trusted side uses :mod:`.protocol` too, to read what the sandbox sends.
"""
