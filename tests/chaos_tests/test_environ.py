"""``chaos.environ.restored_environ``: the named variables are back as they were after the
block (set ones to their value, unset ones removed), also when the block raises."""

from __future__ import annotations

import os

import pytest

from chaos.environ import restored_environ

SET, UNSET = "FAULTLAB_TEST_ENV_SET", "FAULTLAB_TEST_ENV_UNSET"


def test_set_and_unset_variables_come_back_even_after_a_raise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SET, "before")
    monkeypatch.delenv(UNSET, raising=False)
    with pytest.raises(RuntimeError), restored_environ([SET, UNSET]) as saved:
        assert saved == {SET: "before", UNSET: None}
        os.environ[SET], os.environ[UNSET] = "during", "during"
        raise RuntimeError("the block failed")
    assert os.environ[SET] == "before" and UNSET not in os.environ
