"""``tokensvc storage status|migrate|finalize`` as an operator runs them, against the store of
a config file: what they print, and a mistake as one line with exit code 1. The memory
backend has no format: each says so and does nothing."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest
from primary import Fault, ReplicaSet
from test_wire_format import opened, write_credentials, written_by_0_9_0

from tokensvc import __version__
from tokensvc.cli import main as cli


@pytest.fixture
def config(tmp_path, primary):
    path = tmp_path / "tokensvc.toml"
    path.write_text(f'demo = true\n[storage]\nbackend = "mongodb"\nmongodb_uri = "{primary.uri()}"\n'
                    'timeout_ms = 3000\n')
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["storage", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def opened_by_this_release(primary: ReplicaSet, credentials: bool = True) -> None:
    """A process of this release opened the store (and wrote a code, a family, a session)."""
    async def process() -> None:
        store = await opened(primary)
        if credentials:
            await write_credentials(store)
        await store.close()

    asyncio.run(process())


def test_status_says_where_the_store_stands_and_what_finalize_waits_for(primary, config, capsys):
    written_by_0_9_0(primary)
    opened_by_this_release(primary)
    code, out, _ = run(capsys, "status", "--config", config)
    assert code == 0
    for line in ("format:         3 (the newest format of a release that opened the store)",
                 "compatibility:  1 (written by every process; every running release must read it)",
                 f"this release:   tokensvc {__version__}, reads formats 1 to 3",
                 "at finalize:    packed-hashes: codes, sessions and token families keyed by the hash's 32 bytes, and "
                 "every hash they hold packed (3 rows)",
                 f"releases seen:  0.9.0 or earlier (wrote format 1), {__version__} (opened the store 20",
                 "running processes:\n  none registered",
                 "connected now:\n  none",  # not the command's own connections
                 "finalize: ready (tokensvc storage finalize)"):
        assert line in out, out
    assert "WARNING" not in out, out
    code, out, _ = run(capsys, "migrate", "--config", config)
    assert (code, out) == (0, "no migration due\npacked-hashes runs at finalize (tokensvc storage finalize): codes, "
                              "sessions and token families keyed by the hash's 32 bytes, and every hash they hold "
                              "packed\n")
    code, out, err = run(capsys, "finalize", "--config", config)
    assert code == 0
    assert out == "finalized: compatibility 1 -> 3; every process writes format 3; packed-hashes: 3 rows converted\n"
    assert "packed-hashes: 3 rows converted (now in families)" in err
    code, out, _ = run(capsys, "status", "--config", config)
    assert "compatibility:  3" in out and "migration done: packed-hashes (3 rows" in out and "finalize:" not in out
    assert "WARNING" not in out, out  # the command's own connections are no release that cannot read the store
    assert "finalized:      to 3 at " in out
    code, out, _ = run(capsys, "finalize", "--json", "--config", config)
    assert (code, json.loads(out)) == (0, {"compatibility": 3, "from": 3, "converted": {}})


def test_a_refusal_is_one_line_and_exit_code_1(primary, config, capsys):
    code, _, err = run(capsys, "finalize", "--config", config)  # nothing ever opened the store
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("tokensvc: the store has no format document: 0.9.0 wrote it (format 1), or it is empty; "
                          "the first tokensvc serve of this release records its format")
    opened_by_this_release(primary, credentials=False)
    primary.db["tokensvc"]["meta"].update_one({"_id": "format"}, {"$set": {"format": 4, "compatibility": 4}})
    for command in ("finalize", "migrate"):
        code, _, err = run(capsys, command, "--config", config)
        assert code == 1 and err == (f"tokensvc: the store holds format 4 (its compatibility version), which tokensvc "
                                     f"{__version__} cannot read (it reads formats 1 to 3): run a later release, "
                                     "one that reads format 4\n")
    code, out, _ = run(capsys, "status", "--json", "--config", config)  # status still says where it stands
    assert code == 0 and (json.loads(out)["format"], json.loads(out)["compatibility"]) == (4, 4)


def test_a_store_that_answers_nothing_is_one_line_and_leaves_nothing_running(primary, config, capsys, caplog):
    """The primary crashed (it answers nothing, closes nothing): each command gives up at its
    budget with one line, exit code 1, and nothing else, then or later: no call of the driver
    is left running when it ends (a task destroyed while pending would say so when collected)."""
    import gc

    opened_by_this_release(primary, credentials=False)
    primary.crash(after=None)
    for command in ("status", "migrate", "finalize"):
        code, out, err = run(capsys, command, "--config", config)
        assert (code, out) == (1, "") and err.count("\n") == 1, err
        assert err.startswith("tokensvc: the store is not answering: MongoDB: "), err
    gc.collect()
    assert capsys.readouterr().err == ""
    assert [record.getMessage() for record in caplog.records if record.name == "asyncio"] == []


@pytest.mark.parametrize("command", ["status", "migrate", "finalize"])
def test_the_memory_backend_has_no_format_and_each_command_says_so(tmp_path, capsys, command):
    path = tmp_path / "tokensvc.toml"
    path.write_text("demo = true\n")
    code = cli.main(["storage", command, "--config", str(path)])
    captured = capsys.readouterr()
    assert code == 0 and captured.out == ""
    assert captured.err.startswith("the memory backend keeps nothing across a restart: it stores no format")
    code = cli.main(["storage", command, "--json", "--config", str(path)])  # a script gets its answer on stdout
    answer = json.loads(capsys.readouterr().out)
    assert code == 0 and answer["backend"] == "memory" and answer["format"] is None
    assert answer["message"].startswith("the memory backend keeps nothing across a restart")


def many_format_1_families(primary: ReplicaSet, count: int) -> list[str]:
    """``count`` families as 0.9.0 writes them (copies of the one written, new hashes); their ids."""
    import copy
    import secrets

    families = primary.db["tokensvc"]["families"]
    model = families.find_one({"_id": {"$type": "string"}})
    written = []
    for _ in range(count):
        family = copy.deepcopy(model)
        family.update(_id=secrets.token_hex(32), refresh_hash=secrets.token_hex(32), access_hash=secrets.token_hex(32))
        family.pop("family_key", None)
        written.append(family)
    families.insert_many(written)
    return [family["_id"] for family in written]


def test_each_rows_move_has_its_own_budget_and_batches_end_in_time(primary, tmp_path, capsys, monkeypatch):
    """A server slow to write (each family's copy takes 80 ms) and a budget of 2 s: the 43 moves
    take longer than one budget (one batch of 500 would need far more); each document's move has
    its own, and a batch ends after BATCH_SECONDS, its progress recorded and printed. The budget
    is 25 times one copy's delay, so a busy machine's stalls do not exhaust it."""
    from tokensvc.storage.mongo import migrations

    written_by_0_9_0(primary)
    opened_by_this_release(primary)
    many_format_1_families(primary, 40)
    path = tmp_path / "slow.toml"
    path.write_text(f'demo = true\n[storage]\nbackend = "mongodb"\nmongodb_uri = "{primary.uri()}"\n'
                    'timeout_ms = 2000\n')
    primary.script(Fault("insert", "delay", collection="families", seconds=0.08, times=10**6))
    monkeypatch.setattr(migrations, "BATCH_SECONDS", 0.5)
    code, out, err = run(capsys, "finalize", "--config", str(path))
    assert code == 0, err
    assert out.endswith("packed-hashes: 43 rows converted\n")
    lines = [line for line in err.splitlines() if "(now in families)" in line]
    assert len(lines) >= 3, err  # batches of about half a second, not one of 500 documents
    assert primary.db["tokensvc"]["families"].count_documents({"_id": {"$type": "string"}}) == 0


def test_a_pass_the_store_stops_says_so_and_the_next_resumes(primary, config, capsys):
    written_by_0_9_0(primary)
    opened_by_this_release(primary)
    many_format_1_families(primary, 5)
    # The store stops answering at the families' copies (every attempt within the budget): the
    # first family is frozen, not copied; the code and the session are moved.
    primary.script(Fault("insert", "error", collection="families", code=91, labels=("RetryableWriteError",),
                         times=10**6))
    code, _, err = run(capsys, "finalize", "--config", config)
    *progress, said = err.splitlines()
    assert code == 1 and progress == ["packed-hashes: 1 rows converted (now in codes)",
                                      "packed-hashes: 2 rows converted (now in sessions)"], err
    assert said.startswith("tokensvc: finalized: the compatibility version is raised from 1 to 3 (irreversible: "
                           "tokensvc storage finalize need not run again); but migration packed-hashes stopped with "
                           "2 rows converted store-wide (MongoDB: "), err
    assert said.endswith("it resumes where it stood: run tokensvc storage migrate (the running service also resumes "
                         "it in the background)") and "not answering" not in err
    primary.faults.clear()
    code, out, _ = run(capsys, "migrate", "--config", config)
    assert code == 0 and out == "packed-hashes: 8 rows converted\n", out
    code, out, _ = run(capsys, "status", "--json", "--config", config)
    assert json.loads(out)["migrations"]["done"]["packed-hashes"]["rows"] == 8


def test_serve_stops_on_a_store_it_cannot_read_with_one_line(primary, config):
    """tokensvc serve: the refusal ends start-up (no retrying, no half-served store), the
    process stops with the one line, and its entry among the running processes says stopped."""
    from helpers import serve_refusal

    from tokensvc.cli.admin import load_settings

    opened_by_this_release(primary, credentials=False)
    primary.db["tokensvc"]["meta"].update_one({"_id": "format"}, {"$set": {"format": 4, "compatibility": 4}})
    message = serve_refusal(load_settings(argparse.Namespace(config=config)))
    assert message == (f"the store holds format 4 (its compatibility version), which tokensvc {__version__} "
                       "cannot read (it reads formats 1 to 3): run a later release, one that reads format 4")
    assert primary.db["tokensvc"]["processes"].find_one()["stopped_at"] is not None
