"""Workers cap their intra-op threads unless the user set OMP_NUM_THREADS."""

from __future__ import annotations

import os

import pytest


def _threads(worker: object) -> tuple[str, int]:
    import torch

    return os.environ.get("OMP_NUM_THREADS", ""), torch.get_num_threads()


def test_workers_cap_threads(make_executor, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    ex = make_executor(worker_threads=1)
    assert ex.collective_rpc(_threads) == [("1", 1), ("1", 1)]


def test_user_setting_is_respected(make_executor, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    ex = make_executor()
    assert [env for env, _ in ex.collective_rpc(_threads)] == ["2", "2"]
