"""The pytest entry point (``pytest11``): the ``--faultlab-*`` options, and nothing else
until ``--faultlab-suite`` is given.

    pytest starts ─► pytest_addoption: the options (this module imports pytest only)
    pytest_configure ─► --faultlab-suite given? ─► register chaos.pytest_plugin.SuitePlugin
                                          absent? ─► nothing: an ordinary run is unchanged

Why a separate module: importing anything under ``chaos`` imports the chaos package, and
with it the executor and telemetry (0.3-0.8 s on the 2-core machine, as long as pytest's own
start-up).  Every pytest run in an environment where faultlab is installed loads this entry
point, so the cost is paid only by runs that ask for a suite.
"""

from __future__ import annotations

import pytest

PLUGIN_NAME = "faultlab-suites"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("faultlab", "faultlab chaos suites as test items")
    group.addoption("--faultlab-suite", action="append", default=[], metavar="NAME_OR_PATH",
                    help="collect this chaos suite's scenarios as test items, ids SUITE::SCENARIO "
                         "(a built-in name such as smoke, or a .toml path; repeatable).  Without "
                         "path arguments only the suites are collected, not testpaths")
    group.addoption("--faultlab-seed", type=int, default=None, metavar="N",
                    help="the seed of every suite scenario (default: each suite's own)")
    group.addoption("--faultlab-out", default=None, metavar="DIR",
                    help="run directories go to DIR/SUITE/SCENARIO (default: under pytest's "
                         "temporary directory, basetemp/faultlab/SUITE/SCENARIO)")
    group.addoption("--faultlab-start-method", default=None,
                    choices=("fork", "forkserver", "spawn"),
                    help="override every [[scenario]]'s start method")
    group.addoption("--faultlab-target", default="faultlab", metavar="NAME",
                    help="the target that [[target_scenario]] tables run on (default faultlab)")


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("faultlab_suite"):
        return
    from chaos.pytest_plugin import SuitePlugin

    config.pluginmanager.register(SuitePlugin(config), PLUGIN_NAME)
