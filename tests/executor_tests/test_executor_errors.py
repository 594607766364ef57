"""Errors in every phase of a call end in a documented error, and the executor keeps serving."""

from __future__ import annotations

import pickle

import pytest
from exec_helpers import (
    ExitOnUnpickle,
    RaiseOnUnpickle,
    Unpicklable,
    call_sys_exit,
    return_exit_on_unpickle,
    return_unpicklable,
)

from executor import (
    ExecutorConfig,
    MultiprocExecutor,
    ReplyUnpicklingError,
    RequestPicklingError,
    WorkerError,
)


def _still_serving(ex: MultiprocExecutor) -> None:
    assert ex.collective_rpc("echo", args=("ok",)) == ["ok", "ok"]


def test_method_exception_carries_type_message_and_traceback(executor: MultiprocExecutor) -> None:
    with pytest.raises(WorkerError) as info:
        executor.collective_rpc("fail", args=("bad input",))
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.exc_type == "builtins.ValueError" and err.exc_message == "bad input"
    assert "in fail" in err.remote_traceback and err.rank == 0
    assert "bad input" in str(err)
    _still_serving(executor)


# (what goes wrong, the call that triggers it, the error, a phrase of its message)
CASES = [
    ("unknown method", lambda ex: ex.collective_rpc("no_such_method"), WorkerError, "has no method"),
    ("sys.exit in the method", lambda ex: ex.collective_rpc(call_sys_exit), WorkerError, "SystemExit"),
    ("unpicklable argument", lambda ex: ex.collective_rpc("echo", args=(Unpicklable(),)),
     RequestPicklingError, "cannot be pickled"),
    ("worker cannot unpickle the request", lambda ex: ex.collective_rpc("echo", args=(RaiseOnUnpickle(),)),
     WorkerError, "could not unpickle the request"),
    ("sys.exit while the worker unpickles", lambda ex: ex.collective_rpc("echo", args=(ExitOnUnpickle(),)),
     WorkerError, "could not unpickle the request"),
    ("worker cannot pickle the reply", lambda ex: ex.collective_rpc(return_unpicklable),
     WorkerError, "could not pickle the reply"),
    ("sys.exit while the driver unpickles the reply", lambda ex: ex.collective_rpc(return_exit_on_unpickle),
     ReplyUnpicklingError, "could not be unpickled in the driver"),
]


@pytest.mark.parametrize(("what", "call", "error", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_every_phase_fails_cleanly(executor, what, call, error, phrase) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=phrase):
        call(executor)
    _still_serving(executor)


def test_pickling_errors_are_both_type_and_pickling_errors(executor: MultiprocExecutor) -> None:
    with pytest.raises(TypeError):
        executor.collective_rpc("echo", args=(Unpicklable(),))
    with pytest.raises(pickle.PicklingError):
        executor.collective_rpc("echo", args=(Unpicklable(),), non_block=True)
    _still_serving(executor)


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        ({"timeout": -1}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"unique_reply_rank": 2}, "unique_reply_rank"),
        ({"unique_reply_rank": -1}, "unique_reply_rank"),
    ],
)
def test_bad_call_arguments_raise_value_error(executor, kwargs, phrase) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=phrase):
        executor.collective_rpc("echo", args=(1,), **kwargs)
    _still_serving(executor)


@pytest.mark.parametrize(
    ("call_kwargs", "phrase"),
    [({"args": "abc"}, "args must be"), ({"kwargs": [1]}, "kwargs must be"),
     ({"method": 3}, "method must be")],
)
def test_bad_call_types_raise_type_error(executor, call_kwargs, phrase) -> None:  # type: ignore[no-untyped-def]
    kwargs = {"method": "echo", **call_kwargs}
    with pytest.raises(TypeError, match=phrase):
        executor.collective_rpc(**kwargs)
    _still_serving(executor)


@pytest.mark.parametrize(
    ("fields", "phrase"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"pipeline_parallel_size": -2}, "pipeline_parallel_size"),
        ({"worker": "no_colon"}, "module:Class"),
        ({"start_method": "vfork"}, "start_method"),
        ({"chunk_bytes": 8}, "chunk_bytes"),
        ({"n_chunks": 1}, "n_chunks"),
        ({"startup_timeout": 0}, "startup_timeout"),
        ({"tensor_parallel_size": 16, "pipeline_parallel_size": 16}, "world_size"),
    ],
)
def test_invalid_config_is_rejected_before_anything_starts(fields, phrase) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=phrase):
        ExecutorConfig(**fields)


def test_config_must_be_an_executor_config() -> None:
    with pytest.raises(TypeError, match="ExecutorConfig"):
        MultiprocExecutor({"tensor_parallel_size": 2})  # type: ignore[arg-type]
