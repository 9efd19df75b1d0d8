"""One base for the failures netsense reports as a one-line reason (never a traceback); the CLI exits
with the error's own code."""

from __future__ import annotations


class NetsenseError(Exception):
    """A failure whose message says what went wrong and what to do; exit code 1 (a failure while running)."""

    exit_code = 1


class BadInput(NetsenseError):
    """The input is wrong and nothing was created; exit code 2."""

    exit_code = 2


class Terminated(BaseException):
    """SIGTERM/SIGHUP, raised so that `finally` blocks and context managers clean up (a BaseException: no
    ``except Exception`` swallows it)."""
