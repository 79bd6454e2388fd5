"""Shared fixtures: a fresh store and app per test, served over real HTTP by pytest-tornado;
and the guard that fails a test leaving a process behind."""

from __future__ import annotations

import os
import subprocess

import children
import multikey
import pytest
from backends import open_store
from helpers import Browser, Clock, make_config

from tokensvc.app import make_app
from tokensvc.bootstrap import make_context, seed
from tokensvc.storage.memory import MemoryStore

multikey.install()  # the stand-ins keep a unique index on an array as a server does

# Every server of the tests listens on this host. A proxy the caller's environment names
# (http_proxy, https_proxy, all_proxy) must not carry the clients the tests drive to it
# (requests, Authlib, Selenium, Chromium, curl): loopback is added to no_proxy, in the forms
# each of them understands, for this run and the processes it starts.
LOOPBACK = ("localhost", "127.0.0.1", "127.0.0.0/8", "::1")
for _name in ("no_proxy", "NO_PROXY"):
    os.environ[_name] = ",".join(filter(None, (os.environ.get(_name), *LOOPBACK)))


@pytest.fixture
def config():
    return make_config()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store():
    return MemoryStore()


@pytest.fixture
def backend_store(request, io_loop):
    """A store of the backend named by ``request.param`` (see backends.BACKENDS)."""
    store, cleanup = open_store(request.param, io_loop)
    yield store
    cleanup()


@pytest.fixture
def ctx(store, config, clock):
    return make_context(config, store, clock=clock)


@pytest.fixture
def app(io_loop, store, config, ctx):
    io_loop.run_sync(lambda: seed(store, config))
    return make_app(config, store, ctx)


@pytest.fixture
def browser(http_client, base_url, clock):
    return Browser(http_client, base_url, clock)


# -- the fast tier ------------------------------------------------------------------------------

# `make check` runs the tests marked none of e2e, wire, upgrade, browser and process, with
# TOKENSVC_TEST_TIER=check: there a test that starts a process fails, naming the marker it
# lacks, so the fast tier stays what CONTRIBUTING.md says it is.
FAST_TIER = os.environ.get("TOKENSVC_TEST_TIER") == "check"


def _refuse(*args, **kwargs):
    raise AssertionError("a test that starts a process belongs to `make test` only: mark it "
                         "pytest.mark.process (or e2e when it starts the service)")


@pytest.fixture(scope="session", autouse=True)
def no_process_in_the_fast_tier():
    """Set up where the tests run, before any other fixture: a pytest-xdist worker, or a run
    without workers; never in the controller, which starts its workers as processes."""
    if not FAST_TIER:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", _refuse)
        patch.setattr(os, "fork", _refuse)
        yield


SLOW_TIERS = ("e2e", "wire", "upgrade", "browser", "process")

# The files that take longest, longest first (the sum of their tests' durations, --durations=0,
# in `make test` and `make check`): each is handed to a worker before any other file.
LONGEST_FIRST = (
    "upgrade/test_upgrade.py", "wire/test_wire_processes.py", "test_fuzz.py", "wire/test_wire_outages.py",
    "test_fuzz_admin.py", "wire/test_wire_chaos.py", "test_browser.py", "wire/test_wire_ownership.py",
    "test_admin_cli.py", "wire/test_wire_election.py", "test_apply.py",
    # make check's own
    "test_feed_limits.py", "test_races.py", "test_resource_feed.py", "test_families.py", "test_limits.py",
    "test_cli.py", "test_config.py", "test_resource.py", "test_admin_api.py", "test_processes.py",
    "test_demotion.py", "test_authorize.py",
)


@pytest.hookimpl(trylast=True)  # after the wire and upgrade conftests have marked their tests
def pytest_collection_modifyitems(config, items):
    """The longest files first, then the rest of the slow tiers, then the others: `make test`
    and `make check` hand whole files to their workers in this order (pytest-xdist's
    --no-loadscope-reorder), so the long ones start at once and the short ones fill the gaps."""
    tests = config.rootpath / "tests"
    rank = {tests / name: index for index, name in enumerate(LONGEST_FIRST)}
    slow = {item.path for item in items if any(item.get_closest_marker(name) for name in SLOW_TIERS)}
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), item.path not in slow))


# -- no process left behind ---------------------------------------------------------------------

# How long a process a test started may take to end after the test (a browser's helpers after
# the browser quit): a bound for a hang, not a speed.
ENDING_SECONDS = 10.0
_AT_START: set[children.Child] = set()


def pytest_sessionstart(session):
    children.become_subreaper()
    _AT_START.update(children.descendants())


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every process a test started (its function-scoped fixtures' included) has ended when it
    ends; one that has not is killed, and the test fails naming it."""
    before = children.descendants()
    yield
    # A process a module's fixture started (a shared browser) may start processes of its own.
    left = children.left_behind(before, ENDING_SECONDS, beneath_before=True)
    if left:
        pytest.fail("the test left processes running (now killed): "
                    + "; ".join(f"{child.pid} {child.command}" for child in left), pytrace=False)


def pytest_sessionfinish(session):
    """What a module's or the session's fixtures left running fails the run."""
    left = children.left_behind(_AT_START, ENDING_SECONDS)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for child in left:
            reporter.write_line(f"left running by a fixture (now killed): {child.pid} {child.command}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
