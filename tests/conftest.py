"""Shared fixtures: a fresh store and app per test, served over real HTTP by pytest-tornado."""

from __future__ import annotations

import pytest
from backends import open_store
from helpers import Browser, Clock, make_config

from tokensvc.app import make_app
from tokensvc.bootstrap import make_context, seed
from tokensvc.storage.memory import MemoryStore


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
