import pytest
from channels.testing import WebsocketCommunicator

from pool.backends import load_backends
from pool.backends.scripted import SCRIPT
from pool.conf import get_config
from pool.registry import PoolRegistry, set_registry

from .helpers import Client


@pytest.fixture
def scripted_pool(settings):
    """A pool of 2 units on the scripted test backend (real Silero VAD), installed as the
    process's pool for the test."""
    settings.S2S = {"BACKEND": "scripted", "POOL_SIZE": 2, "RELEASE_AFTER_SECONDS": 1.0}
    config = get_config()
    registry = PoolRegistry(load_backends(config), config["POOL_SIZE"], config["RELEASE_AFTER_SECONDS"])
    previous = set_registry(registry)
    SCRIPT.reset()
    yield registry
    SCRIPT.wedge.clear()
    registry.shutdown()
    set_registry(previous)
    SCRIPT.reset()


@pytest.fixture
def connect(scripted_pool):
    """``await connect()`` -> a connected Client on the scripted pool (disconnected after)."""
    from s2s_project.asgi import application

    async def _connect(path="/v1/realtime", subprotocols=None):
        communicator = WebsocketCommunicator(application, path, subprotocols=subprotocols)
        connected, subprotocol = await communicator.connect()
        assert connected
        client = Client(communicator)
        client.subprotocol = subprotocol
        return client

    return _connect
