import json
import os

import pytest
from channels.testing import WebsocketCommunicator
from hypothesis import settings as hypothesis_settings

from pool.backends.scripted import SCRIPT
from pool.conf import get_config
from pool.process import build_registry, set_registry
from pool.testing import LiveServer

from .helpers import Client

# What a test needs, read from the fixtures it uses (tests that start their own servers or
# services carry the marks themselves). The markers are listed in pyproject.toml; `make
# test-fast` runs what needs none of them.
NEEDS = {"server": ("models", "live"), "scripted_server": ("live",), "stt": ("models",), "whisper": ("models",), "gguf": ("models",),
         "speak": ("models",), "cluster": ("live", "postgres", "redis")}


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            for marker in NEEDS.get(fixture, ()):
                item.add_marker(marker)


# CI (.ci/run sets CI) draws the same inputs for each property test every run, so that a build is
# not red by the luck of one draw; a local run draws new ones, and an input found there becomes a
# fixed @example beside its test ("1**1" in test_spoken.py was found so).
hypothesis_settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

# The session-wide live servers take every test's connects from one address, faster than the
# default CONNECTS_PER_MINUTE (60) allows; test_production tests that default.
MANY_CONNECTS = {"S2S_JSON": json.dumps({"CONNECTS_PER_MINUTE": None})}
# The scripted TTS speaks a 220 Hz tone: a reference no speech echoes, and which a low voice can
# correlate with. Echo cancellation is tested with real speech (test_echo, test_e2e_interruptions).
SCRIPTED = {"BACKEND": "scripted", "POOL_SIZE": 2, "RELEASE_AFTER_SECONDS": 2.0, "ALLOW_ANONYMOUS": True,
            "ECHO_CANCELLATION_TRANSPORTS": []}


@pytest.fixture
def scripted_pool(settings, transactional_db):
    """A pool of 2 units on the scripted test backend (real Silero VAD), installed as the
    process's pool for the test; no database records (channels still closes old connections)."""
    settings.S2S = SCRIPTED
    yield from installed(build_registry(get_config(), record=False))


@pytest.fixture
def recorded_pool(settings, transactional_db):
    """Like ``scripted_pool`` with 1 unit, recording the process, units and sessions."""
    settings.S2S = {**SCRIPTED, "POOL_SIZE": 1}
    yield from installed(build_registry(get_config(), record=True))


@pytest.fixture
def keyed_pool(recorded_pool, settings):
    """The recorded scripted pool with anonymous access off."""
    settings.S2S = {**settings.S2S, "ALLOW_ANONYMOUS": False, "POOL_SIZE": 1}
    return recorded_pool


def installed(registry):
    previous = set_registry(registry)
    SCRIPT.reset()
    yield registry
    SCRIPT.wedge.clear()
    registry.shutdown()
    set_registry(previous)
    SCRIPT.reset()


@pytest.fixture
def connect():
    """``await connect()`` -> a connected Client on the installed pool (use with a pool fixture)."""
    from s2s_project.asgi import application

    async def _connect(path="/v1/realtime", subprotocols=None):
        communicator = WebsocketCommunicator(application, path, subprotocols=subprotocols)
        connected, subprotocol = await communicator.connect()
        assert connected
        client = Client(communicator)
        client.subprotocol = subprotocol
        return client

    return _connect


@pytest.fixture(scope="session")
def whisper():
    """The default Whisper model, to transcribe what a server said."""
    from pool.backends.cache import default_paths
    from pool.backends.stt import WhisperSTT

    return WhisperSTT(default_paths(get_config()["MODEL_CACHE_DIR"])["stt"])


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A live runpool server with the real default models, a pool of one unit, an admin user."""
    live = LiveServer(tmp_path_factory.mktemp("server"), env=MANY_CONNECTS)
    live.create_admin()
    yield live
    assert live.stop() == 0


@pytest.fixture(scope="session")
def scripted_server(tmp_path_factory):
    """A live runpool server on the scripted test backend, pool of 2, with an admin user."""
    live = LiveServer(tmp_path_factory.mktemp("scripted"), pool_size=2, env={
        "S2S_BACKEND": "scripted",
        "S2S_JSON": json.dumps({"CONNECTS_PER_MINUTE": None, "ECHO_CANCELLATION_TRANSPORTS": []})})
    live.create_admin()
    yield live
    assert live.stop() == 0
