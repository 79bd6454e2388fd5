"""The harness itself, which the suite's determinism on a busy machine rests on: the guard fails
a test that leaves a process behind (an orphan too), ``end`` stops a process's whole group, and
the wait for a service takes any request error for "not yet" until its deadline."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import children
import pytest
import requests
import service
from helpers import wait_until

TESTS = Path(__file__).resolve().parent


def running_with(marker: str) -> list[int]:
    """The processes of the machine whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.process
def test_the_guard_fails_a_test_that_leaves_a_process_and_ends_it(tmp_path):
    marker = f"left-{uuid.uuid4().hex}"
    sleeper = f"import time; time.sleep(300)  # {marker}"
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {str(TESTS)!r})
        spec = importlib.util.spec_from_file_location("guarded", {str(TESTS / "conftest.py")!r})
        guarded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(guarded)
        guarded.ENDING_SECONDS = 1.0
        no_process_left_behind = guarded.no_process_left_behind
        pytest_sessionstart, pytest_sessionfinish = guarded.pytest_sessionstart, guarded.pytest_sessionfinish
    """))
    (tmp_path / "test_leaks.py").write_text(textwrap.dedent(f"""
        import subprocess, sys
        import pytest

        SLEEPER = [sys.executable, "-c", {sleeper!r}]

        def test_ends_what_it_starts():
            process = subprocess.Popen(SLEEPER)
            process.kill()
            process.wait()

        def test_leaves_a_child():
            subprocess.Popen(SLEEPER)

        def test_leaves_an_orphan():  # its parent ends at once: init would have adopted it
            subprocess.run([sys.executable, "-c", f"import subprocess; subprocess.Popen({{SLEEPER!r}})"], check=True)

        @pytest.fixture(scope="module")
        def leaky():
            yield subprocess.Popen(SLEEPER)

        def test_beside_a_leaky_module_fixture(leaky):
            pass
    """))
    # An ini file of its own: the inner run takes no configuration from above tmp_path (a TMPDIR
    # inside a checkout would find the project's setup.cfg).
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    plugins = [flag for plugin in ("cacheprovider", "schemathesis", "hypothesispytest", "anyio", "tornado")
               for flag in ("-p", f"no:{plugin}")]  # none is needed here, and they take seconds to load
    # The output counted below is the same whatever the caller's terminal and environment: -rN, no
    # short summary (its lines repeat each message only when the terminal is wide enough, COLUMNS,
    # to hold it); --color=no, whatever FORCE_COLOR or PY_COLORS say; and no PYTEST_ADDOPTS (a -q).
    environ = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    result = subprocess.run([sys.executable, "-m", "pytest", *plugins, "-v", "-rN", "--color=no", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environ)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "test_ends_what_it_starts PASSED" in out and "test_beside_a_leaky_module_fixture PASSED" in out
    assert "test_leaves_a_child ERROR" in out and "test_leaves_an_orphan ERROR" in out  # failed at its teardown
    assert out.count("the test left processes running (now killed)") == 2
    assert out.count("left running by a fixture (now killed)") == 1
    assert running_with(marker) == []


@pytest.mark.process
def test_end_stops_the_whole_group_even_when_it_ignores_sigterm():
    marker = f"stubborn-{uuid.uuid4().hex}"
    stubborn = f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)  # {marker}"
    starter = (f"import signal, subprocess, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               f"subprocess.Popen([sys.executable, '-c', {stubborn!r}]); print('started', flush=True); "
               f"signal.pause()  # {marker}")
    process = service.spawn([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "started\n"
    wait_until(lambda: len(running_with(marker)) == 2, "the starter and its child")
    service.end(process, grace=0.5)
    assert process.returncode == -9 and running_with(marker) == []


@pytest.mark.process
def test_end_lets_the_workers_drain_after_their_leader_ended(tmp_path):
    """``--processes N``: the supervisor may end before its workers, which finish what they
    serve first; end() waits for the whole group, and kills none of it that ends in time."""
    drained = tmp_path / "drained"
    worker = (f"import pathlib, signal, sys, time\n"
              f"def drain(*_):\n"
              f"    time.sleep(0.5)  # the requests in flight\n"
              f"    pathlib.Path({str(drained)!r}).write_text('done')\n"
              f"    sys.exit(0)\n"
              f"signal.signal(signal.SIGTERM, drain)\n"
              f"print('ready', flush=True)\n"
              f"signal.pause()\n")
    leader = (f"import subprocess, sys; worker = subprocess.Popen([sys.executable, '-c', {worker!r}], "
              f"stdout=subprocess.PIPE, text=True); print(worker.stdout.readline(), end='', flush=True); "
              f"import signal; signal.pause()")
    process = service.spawn([sys.executable, "-c", leader], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    service.end(process)
    assert process.returncode == -15 and drained.read_text() == "done"
    assert children.group_running(process.pid) == []


@pytest.mark.process
def test_end_returns_what_a_process_that_ended_by_itself_wrote():
    """A process found ended (its exit seen by poll(), as a wait for a service sees it) is not
    signalled, and what it wrote before it ended, which says why, is returned all the same."""
    process = service.spawn([sys.executable, "-c", "import sys; print('said'); sys.exit('failed')"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: process.poll() is not None, "the process's end")
    assert service.end(process) == ("said\n", "failed\n") and process.returncode == 1


class Starting:
    """A process that has not exited."""

    args = ["tokensvc"]
    returncode = None

    def poll(self):
        return None


def test_the_wait_for_a_service_takes_any_request_error_for_not_yet(monkeypatch):
    """A busy machine makes a starting service refuse, time out, reset and cut answers short:
    none of it ends the wait before the deadline."""
    answers = [requests.ConnectionError("refused"), requests.ReadTimeout("busy"),
               requests.exceptions.ChunkedEncodingError("cut short"), requests.ConnectTimeout("busy"),
               type("Answer", (), {"status_code": 503})(), type("Answer", (), {"status_code": 200})()]
    asked = []

    def get(url, timeout):
        asked.append(url)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(service.requests, "get", get)
    service.wait_for_http("http://127.0.0.1:1/healthz", Starting(), deadline=30)
    assert len(asked) == 6 and not answers


def test_the_wait_for_a_service_ends_it_at_the_deadline(monkeypatch):
    def refused(url, timeout):
        raise requests.ConnectionError("refused")

    ended = []
    monkeypatch.setattr(service.requests, "get", refused)
    monkeypatch.setattr(service, "end", lambda process, grace=0: ended.append(grace))
    with pytest.raises(AssertionError, match="answering 200"):
        service.wait_for_http("http://127.0.0.1:1/healthz", Starting(), deadline=0.2)
    assert ended == [0]


@pytest.mark.process
def test_the_guard_sees_the_runs_descendants():
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert process.pid in {child.pid for child in children.descendants()}
    finally:
        process.communicate(b"")
    assert process.pid not in {child.pid for child in children.descendants() if child.alive}


class NoContent(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_tests_clients_reach_loopback_whatever_proxy_the_caller_names(monkeypatch):
    """A proxy in the caller's environment (here one that refuses every connection) carries no
    request of the tests to a server on this host: conftest.py exempts loopback (no_proxy)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoContent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(name, "http://127.0.0.1:9")
        for host in ("127.0.0.1", "localhost"):
            assert requests.get(f"http://{host}:{server.server_address[1]}/", timeout=10).status_code == 204
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.process
def test_make_test_runs_pytest_with_no_options_from_the_environment():
    """``make test``'s pytest (the Makefile's PYTEST) collects the suite as setup.cfg defines it,
    whatever PYTEST_ADDOPTS the caller has (here one that would deselect every test)."""
    collect = "collect: ; @$(PYTEST) --collect-only -q -p no:cacheprovider tests/test_harness.py"
    # The Makefile's PYTEST on this run's interpreter, wherever its environment lives.
    result = subprocess.run(["make", "-s", "--no-print-directory", f"VENV={sys.prefix}", "--eval", collect, "collect"],
                            capture_output=True, text=True, timeout=120, cwd=TESTS.parent,
                            env={**os.environ, "PYTEST_ADDOPTS": "-k no_such_test"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tests/test_harness.py::test_make_test_runs_pytest_with_no_options_from_the_environment" in result.stdout
    assert "deselected" not in result.stdout


@pytest.mark.process
def test_the_fast_tier_runs_on_workers_and_fails_a_test_that_starts_a_process(tmp_path):
    """``make check``'s run: pytest-xdist's workers start (the guard is not set where they are
    started), a test that starts nothing passes, and one that starts a process fails, naming
    the marker it lacks."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {str(TESTS)!r})
        spec = importlib.util.spec_from_file_location("guarded", {str(TESTS / "conftest.py")!r})
        guarded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(guarded)
        no_process_in_the_fast_tier = guarded.no_process_in_the_fast_tier
    """))
    (tmp_path / "test_tier.py").write_text(textwrap.dedent("""
        import subprocess, sys

        def test_starts_nothing():
            assert sum(range(4)) == 6

        def test_starts_a_process():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
    """))
    environ = {**os.environ, "TOKENSVC_TEST_TIER": "check"}
    environ.pop("PYTEST_ADDOPTS", None)
    plugins = [flag for plugin in ("cacheprovider", "schemathesis", "hypothesispytest", "anyio", "tornado")
               for flag in ("-p", f"no:{plugin}")]  # none is needed here, and they take seconds to load
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", *plugins, "-n", "2", "-rf",
                             str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environ)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "1 failed, 1 passed" in output, output
    assert "FAILED test_tier.py::test_starts_a_process" in output and "mark it pytest.mark.process" in output, output


def test_the_files_handed_out_first_are_the_suites(request):
    """Each file conftest.py names among the longest is one of the suite's, named once, and the
    collection hands it out before the files it does not name."""
    tests = request.config.rootpath / "tests"
    conftest = next(plugin for plugin in request.config.pluginmanager.get_plugins()
                    if getattr(plugin, "__file__", None) == str(tests / "conftest.py"))
    named = [tests / name for name in conftest.LONGEST_FIRST]
    assert len(set(named)) == len(named) and all(path.is_file() for path in named), named
    order = list(dict.fromkeys(item.path for item in request.session.items))
    present = [path for path in named if path in order]
    assert order[:len(present)] == present
