"""The built-in workloads by name, as suites and the command line give them.

    BUILTIN = chaos.workloads.CORE (standard, futures_mix, steady)
            + chaos.workloads_around.AROUND (bursts, callbacks, hostile values, Ctrl-C, ...)

Its own module so that neither workload module registers the other at import time.
"""

from __future__ import annotations

from chaos.workloads import CORE, Workload
from chaos.workloads_around import AROUND

BUILTIN: dict[str, Workload] = {**CORE, **AROUND}
