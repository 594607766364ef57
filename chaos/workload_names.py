"""The built-in workloads by name, as suites and the command line give them.

    BUILTIN = chaos.workloads.CORE (standard, futures_mix, steady)
            + chaos.edge_workloads.EDGE (bursts, callbacks, hostile values, Ctrl-C, ...)

Its own module so that neither workload module registers the other at import time.
"""

from __future__ import annotations

from chaos.edge_workloads import EDGE
from chaos.workloads import CORE, Workload

BUILTIN: dict[str, Workload] = {**CORE, **EDGE}
