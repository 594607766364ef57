"""``Reporter.calls``, the call loop of the target drivers: every call is made and reported,
a fatal exception also reports the executor's ``error`` (once), any other exception only
fails its call, and ``done`` comes last."""

from __future__ import annotations

import io
import json

from chaos.targets.protocol import Reporter


class Broken(Exception):
    pass


def test_every_call_is_reported_and_the_first_fatal_one_is_the_error() -> None:
    out = io.StringIO()

    def run(i: int) -> int:
        if i == 1:
            raise ValueError("a method error")
        if i >= 2:
            raise Broken(f"pool broken at {i}")
        return 10

    Reporter(out).calls(4, run, Broken)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    seen = [(e["ev"], e.get("id"), e.get("type")) for e in events]
    assert seen == [("invoke", 0, None), ("ok", 0, None),
                    ("invoke", 1, None), ("fail", 1, "ValueError"),
                    ("invoke", 2, None), ("fail", 2, "Broken"), ("error", None, "Broken"),
                    ("invoke", 3, None), ("fail", 3, "Broken"),
                    ("done", None, None)]
    assert events[1]["value"] == 10 and events[6]["message"] == "pool broken at 2"
