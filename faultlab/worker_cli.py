"""``faultlab worker``: start the workers of one remote node of an executor.

    faultlab worker --driver HOST:PORT --node-rank K [--secret-file F]

The driver (a ``MultiprocExecutor`` with ``nnodes > 1``) must be starting: this command
fetches its configuration over the authenticated TCP link, forks node K's workers (ranks
K*local_world_size ..) and waits for them.  The secret is the driver's: ``--secret-file`` or
the ``FAULTLAB_SECRET`` environment variable (hex).
"""

from __future__ import annotations

import argparse
import logging


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--driver", required=True, metavar="HOST:PORT",
                        help="the driver's address (ExecutorConfig.driver_host/driver_port)")
    parser.add_argument("--node-rank", type=int, required=True, metavar="K",
                        help="which node this is, 1 .. nnodes-1")
    parser.add_argument("--secret-file", metavar="F",
                        help="file holding the executor's secret in hex (else $FAULTLAB_SECRET)")
    parser.add_argument("--connect-timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the driver's configuration (default 60)")


def run(args: argparse.Namespace) -> int:
    from executor.tcp_wire import SECRET_ENV, read_secret_file, secret_from_env
    from executor.tcp_worker import run_node

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    secret = read_secret_file(args.secret_file) if args.secret_file else secret_from_env()
    if secret is None:
        raise SystemExit(f"faultlab worker: give --secret-file or set {SECRET_ENV}")
    if args.node_rank < 1:
        raise SystemExit("faultlab worker: --node-rank must be at least 1 (node 0 is the driver's)")
    return run_node(args.driver, args.node_rank, secret, args.connect_timeout)
