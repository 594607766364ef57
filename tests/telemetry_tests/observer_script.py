"""A caller's script, deliberately unguarded at the top: if a worker re-imports it (a
forkserver or spawn child), the import count in argv[1] grows.  Prints, as JSON, the start
method the executor used and the process tree it made."""

import json
import os
import sys

import psutil

with open(sys.argv[1], "a") as counter:  # one line per import of this file
    counter.write(f"{os.getpid()}\n")

if __name__ == "__main__":
    from executor import ExecutorConfig, MultiprocExecutor

    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2)
    with MultiprocExecutor(cfg) as ex:
        ex.collective_rpc("echo", args=(1,), timeout=10.0)
        children = psutil.Process().children(recursive=True)
        workers = sorted(ex.worker_pids)
        tree = {
            "start_method": ex.config.resolved_start_method(),
            "workers": len(workers),
            "workers_are_children": all(p in {c.pid for c in children} for p in workers),
            "helpers": sorted({" ".join(c.cmdline()[-2:]) for c in children
                               if c.pid not in workers and c.name() != "faultlab-guard"}),
            "guards": sum(c.name() == "faultlab-guard" for c in children),
        }
    with open(sys.argv[1]) as counter:
        tree["imports"] = len(counter.read().splitlines())
    print(json.dumps(tree))
