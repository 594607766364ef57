"""Registers the Hypothesis profiles of the property tests (see hypothesis_profiles.py), and
caps shrinking under ci so a failure prints its shrunk example within the test timeout."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis_profiles import PROFILE, shrink_cap


@pytest.fixture
def profile() -> settings:
    """The selected profile (HYPOTHESIS_PROFILE, default ci)."""
    return PROFILE


@pytest.fixture(autouse=True)
def bounded_shrinking() -> Iterator[None]:
    """Every property test: shrinking stops after ``SHRINK_S`` seconds under ci."""
    with shrink_cap():
        yield
