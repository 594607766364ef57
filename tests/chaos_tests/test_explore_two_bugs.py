"""Issue 31, explore's self-test: aimed at an executor planted with TWO bugs that break
disjoint invariants (chaos.mutants.EchoGarbageCallbackTwice: a blocking echo returns garbage,
"results"; the failure callbacks run twice, "callback"), explore files exactly two findings,
not one (the second bug hidden behind the first) nor three (one bug filed twice).

    seeds (fork, plain calls), in this order:
        63  an echo, no fault        results               → finding 1
         5  an echo, a kill (when it lands in time: it fires inside a reply)
                                     results + callback    → finding 2, about callback only
                                  or results               → a duplicate of finding 1
        97  a SIGTERM, no echo       callback              → a duplicate of finding 2,
                                                             or finding 2 when 5 missed
        24  a SIGTERM, no echo       callback              → a duplicate of finding 2
        14  a SIGTERM, no echo       callback              → a duplicate of finding 2

Each finding's shrunk run still breaks one of its own invariants (the shrink never ends on
another failure), and each reproduces.  Real processes: about 10 s on an idle box.
"""

from __future__ import annotations

import json
from pathlib import Path

from chaos import explore
from chaos.explore import Exploration, Limits

SEEDS = (63, 5, 97, 24, 14)  # deaths by signal: a damaged ring's detection is timing's


def test_explore_on_two_planted_bugs_files_exactly_two_findings(tmp_path: Path) -> None:
    ex = Exploration(tmp_path, "chaos.mutants:EchoGarbageCallbackTwice",
                     limits=Limits(shrink_runs=8, reproductions=2), say=lambda text: None)
    findings = ex.run_seeds(SEEDS)
    assert len(findings) == 2, [f.to_dict() for f in findings]
    assert findings[0].seed == 63 and findings[1].seed in (5, 97)
    results, callback = findings
    # what each is about (its shrunk run may break more: an echo that carries the kill)
    assert "results" in results.own and "callback" not in results.signature
    assert callback.own == {"callback"}
    assert [f.tries for f in findings] == [2, 2] and not results.flaky and not callback.flaky
    assert results.duplicates + callback.duplicates == len(SEEDS) - 2  # every run failed
    assert explore.exit_status(findings) == 1
    report = json.loads((tmp_path / "explore.json").read_text())
    assert report["runs"] == len(SEEDS) and len(report["findings"]) == 2
