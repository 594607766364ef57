"""Registers the Hypothesis profiles of the property tests (see hypothesis_profiles.py)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis_profiles import PROFILE


@pytest.fixture
def profile() -> settings:
    """The selected profile (HYPOTHESIS_PROFILE, default ci)."""
    return PROFILE
