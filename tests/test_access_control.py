"""API keys, anonymous access and browser origins, through the WebSocket endpoint."""

import asyncio

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from pool.access.keys import hash_key
from pool.models import APIKey, Session
from pool.testing import LiveServer

from .helpers import open_socket, refused_with


async def issue(**kwargs):
    from asgiref.sync import sync_to_async

    return await sync_to_async(APIKey.issue)("test key", **kwargs)


@pytest.mark.usefixtures("keyed_pool")
async def test_missing_key_is_refused():
    client, _ = await open_socket()
    assert await refused_with(client) == "missing_api_key"


@pytest.mark.usefixtures("keyed_pool")
async def test_wrong_and_placeholder_keys_are_refused():
    client, _ = await open_socket([(b"authorization", b"Bearer s2s_not-a-real-key")])
    assert await refused_with(client) == "invalid_api_key"
    client, _ = await open_socket([(b"authorization", b"Bearer local")])
    assert await refused_with(client) == "invalid_api_key"


@pytest.mark.usefixtures("keyed_pool")
async def test_revoked_key_is_refused():
    api_key, key = await issue()
    api_key.revoked_at = timezone.now()
    await api_key.asave()
    client, _ = await open_socket([(b"authorization", f"Bearer {key}".encode())])
    assert await refused_with(client) == "invalid_api_key"


async def test_key_in_header_is_recorded_on_the_session_row(keyed_pool):
    api_key, key = await issue()
    client, _ = await open_socket([(b"authorization", f"Bearer {key}".encode())])
    created = await client.until("session.created")
    await client.ws.disconnect()
    assert keyed_pool.records.flush()
    row = await Session.objects.aget(session_id=created["session"]["id"])
    assert row.api_key_id == api_key.pk and row.client_address == "192.0.2.7"
    assert key not in str(await Session.objects.filter(pk=row.pk).values().afirst())


@pytest.mark.usefixtures("keyed_pool")
async def test_key_in_the_browser_subprotocol():
    _, key = await issue()
    client, subprotocol = await open_socket(subprotocols=["realtime", f"openai-insecure-api-key.{key}"])
    assert subprotocol == "realtime"
    assert (await client.recv())["type"] == "session.created"
    await client.ws.disconnect()


async def test_key_over_its_session_limit_is_refused(keyed_pool, settings):
    settings.S2S = {**settings.S2S, "POOL_SIZE": 1}
    _, key = await issue(max_sessions=1)
    header = [(b"authorization", f"Bearer {key}".encode())]
    first, _ = await open_socket(header)
    await first.until("session.created")
    second, _ = await open_socket(header)
    error = await second.recv()
    assert error["error"]["code"] == "session_limit_reached" and "API key" in error["error"]["message"]
    await first.ws.disconnect()


@pytest.mark.usefixtures("keyed_pool")
async def test_foreign_origin_is_refused_and_an_allowed_one_passes(settings):
    _, key = await issue()
    auth = (b"authorization", f"Bearer {key}".encode())
    client, _ = await open_socket([auth, (b"origin", b"https://evil.example")])
    assert await refused_with(client) == "origin_not_allowed"
    client, _ = await open_socket([auth, (b"origin", b"http://localhost:8000")])
    assert (await client.recv())["type"] == "session.created"
    await client.ws.disconnect()


async def test_by_default_a_client_without_a_key_is_refused_even_on_loopback(recorded_pool, settings):
    # A reverse proxy on the same host makes every internet client a loopback client.
    settings.S2S = {k: v for k, v in settings.S2S.items() if k != "ALLOW_ANONYMOUS"}
    loopback = {"server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 41000)}
    client, _ = await open_socket(**loopback)
    assert await refused_with(client) == "missing_api_key"
    client, _ = await open_socket([(b"authorization", b"Bearer local")], **loopback)
    assert await refused_with(client) == "invalid_api_key"
    settings.S2S = {**settings.S2S, "ALLOW_ANONYMOUS": True}
    client, _ = await open_socket(**loopback)
    assert (await client.recv())["type"] == "session.created"
    await client.ws.disconnect()


@pytest.mark.live
def test_runpool_behind_a_same_host_proxy_serves_keyed_clients_only(tmp_path):
    """The reported case: runpool on 0.0.0.0 without --allow-anonymous, reached through
    127.0.0.1 as a proxy on the same host would, with the openai SDK."""
    from openai import AsyncOpenAI

    live = LiveServer(tmp_path, env={"S2S_BACKEND": "scripted"}, args=("--host", "0.0.0.0"))
    try:
        key = live.manage("apikey", "create", "proxy test").strip()

        async def first_event(api_key):
            client = AsyncOpenAI(api_key=api_key, websocket_base_url=live.base_url)
            async with client.realtime.connect(model="s2s-default") as conn:
                return await conn.recv()

        refused = asyncio.run(first_event("local"))
        assert (refused.type, refused.error.code) == ("error", "invalid_api_key")
        assert asyncio.run(first_event(key)).type == "session.created"
    finally:
        assert live.stop() == 0


@pytest.mark.django_db
def test_apikey_command_issues_lists_and_revokes(capsys):
    user = User.objects.create_user("owner")
    call_command("apikey", "create", "mobile app", "--user", "owner", "--max-sessions", "3")
    key = capsys.readouterr().out.strip()
    api_key = APIKey.objects.get()
    assert key.startswith("s2s_") and api_key.key_hash == hash_key(key) and key[:12] == api_key.prefix
    assert (api_key.user, api_key.max_sessions) == (user, 3)
    call_command("apikey", "list")
    assert api_key.prefix in capsys.readouterr().out
    call_command("apikey", "revoke", api_key.prefix)
    api_key.refresh_from_db()
    assert api_key.revoked_at is not None


@pytest.mark.django_db
def test_admin_issues_a_key_once_and_stores_only_its_hash(admin_client):
    reply = admin_client.post("/admin/pool/apikey/add/", {"name": "kiosk", "max_sessions": "2"}, follow=True)
    assert reply.status_code == 200
    shown = next(str(m) for m in reply.context["messages"] if "The new key is" in str(m))
    key = shown.split("The new key is ")[1].split(" ")[0]
    api_key = APIKey.objects.get(name="kiosk")
    assert api_key.key_hash == hash_key(key) and key not in api_key.key_hash


@pytest.mark.django_db
def test_metrics_are_for_staff_and_show_units_by_state(client, admin_client, scripted_pool):
    assert client.get("/metrics").status_code == 403
    body = admin_client.get("/metrics").content.decode()
    assert 's2s_units{process=' in body and 'state="idle"} 2.0' in body
    for family in ("s2s_sessions_started", "s2s_sessions_ended", "s2s_quarantines", "s2s_releases",
                   "s2s_errors", "s2s_turn_first_audio_seconds", "s2s_stage_seconds"):
        assert f"# HELP {family}" in body


async def test_metrics_count_sessions_errors_and_turns(scripted_pool, connect):
    from prometheus_client import REGISTRY

    from pool.metrics import PROCESS

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, {"process": PROCESS, **labels}) or 0

    before = (value("s2s_sessions_started_total"), value("s2s_errors_total", code="invalid_json"),
              value("s2s_sessions_ended_total", reason="client_close"))
    client = await connect()
    await client.until("session.created")
    await client.ws.send_to(text_data="{nope")
    await client.until("error")
    await client.ws.disconnect()
    after = (value("s2s_sessions_started_total"), value("s2s_errors_total", code="invalid_json"),
             value("s2s_sessions_ended_total", reason="client_close"))
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]
