"""What the tests share: the repository's root, and how a test says a tool it needs is missing."""

from __future__ import annotations

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def unavailable(what: str) -> None:
    """A tool or privilege the test needs is missing: a skip on a developer's machine, a failure in CI (``CI``
    set), which installs everything the suite needs, so a skip there would hide a test that never ran."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test, but {what}", pytrace=False)
    pytest.skip(what)
