"""Run one chaos scenario as the first thing a fresh interpreter does; print its violations.

    python fresh_scenario.py START_METHOD OUT_DIR [leak-pipe]  ──►  stdout: JSON list

A fresh process matters: multiprocessing starts its resource tracker lazily, on the
first spawn, so only the first scenario of a process sees it appear.  With
``leak-pipe`` the workload opens a pipe and never closes it: a real leak the oracle must
still report.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from chaos import FaultPlan, run_scenario
from chaos.workloads import standard
from executor import ExecutorConfig


def leak_a_pipe(ex: Any) -> None:
    standard(ex)
    os.pipe()


def main(start_method: str, out_dir: str, leak: bool) -> int:
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method=start_method)
    workload = leak_a_pipe if leak else standard
    result = run_scenario(cfg, workload, FaultPlan(), out_dir, name="empty-plan")
    print(json.dumps([str(v) for v in result.violations]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["leak-pipe"]))
