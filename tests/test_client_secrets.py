"""Client secrets on one process (SQLite, the scripted backend): POST /v1/realtime/client_secrets,
the unit it reserves, connecting with the secret, and the refusals. Several processes on
PostgreSQL: tests/test_cluster_admission.py."""

import asyncio
import json
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import AsyncClient
from django.utils import timezone

from pool.conf import get_config
from pool.history import rows
from pool.models import APIKey, ClientSecret, ServerProcess, Unit
from pool.process import build_registry
from pool.states import ProcessState, UnitState

from .conftest import SCRIPTED, installed
from .helpers import open_socket, refused_with

URL = "/v1/realtime/client_secrets"


@pytest.fixture
def pool(settings, transactional_db):
    """A recorded scripted pool of 2 units; clients need a key or a secret."""
    settings.S2S = {**SCRIPTED, "POOL_SIZE": 2, "ALLOW_ANONYMOUS": False}
    yield from installed(build_registry(get_config(), record=True))


@pytest.fixture
async def key():
    return (await sync_to_async(APIKey.issue)("backend"))[1]


async def post(body=None, key=None, raw=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = raw if raw is not None else json.dumps(body or {})
    return await AsyncClient().post(URL, data=data, content_type="application/json", headers=headers)


def bearer(value):
    return [(b"authorization", f"Bearer {value}".encode())]


async def units(pool):
    return {u.index: u async for u in Unit.objects.filter(process_id=pool.records.process_id)}


async def test_a_secret_reserves_a_unit_and_opens_a_session_configured_by_the_backend(pool, key):
    reply = await post({"expires_after": {"anchor": "created_at", "seconds": 120},
                        "session": {"type": "realtime", "instructions": "Speak like a pirate.",
                                    "audio": {"output": {"voice": "echo"}}}}, key)
    assert reply.status_code == 200, reply.content
    body = reply.json()
    assert body["value"].startswith("ek_") and len(body["value"]) > 40
    assert abs(body["expires_at"] - (timezone.now().timestamp() + 120)) < 5
    assert body["session"]["instructions"] == "Speak like a pirate."
    assert body["session"]["audio"]["output"]["voice"] == "echo"
    assert body["connect_url"] == "ws://testserver/v1/realtime"  # no PUBLIC_URL: where it was asked
    assert body["calls_url"] == "http://testserver/v1/realtime/calls"  # the same process over WebRTC
    secret = await ClientSecret.objects.aget(prefix=body["value"][:12])
    reserved = (await units(pool))[secret.unit_index]
    assert reserved.state == UnitState.IDLE and reserved.reserved_until > timezone.now()

    client, _ = await open_socket(bearer(body["value"]))
    created = await client.until("session.created")
    assert created["session"]["instructions"] == "Speak like a pirate."
    assert created["session"]["audio"]["output"]["voice"] == "echo"
    row = (await units(pool))[secret.unit_index]
    assert row.state == UnitState.ACTIVE and row.session_id == created["session"]["id"]
    assert row.reserved_until is None
    await secret.arefresh_from_db()
    assert secret.used_at is not None and secret.session_id == created["session"]["id"]
    await client.send({"type": "response.create"})
    assert (await client.until("response.done"))["response"]["status"] == "completed"

    again, _ = await open_socket(bearer(body["value"]))  # single use
    assert await refused_with(again) == "invalid_api_key"
    await client.ws.disconnect()


async def test_the_browser_subprotocol_carries_a_secret_too(pool, key):
    value = (await post({}, key)).json()["value"]
    client, subprotocol = await open_socket(subprotocols=["realtime", f"openai-insecure-api-key.{value}"])
    assert subprotocol == "realtime"
    assert (await client.until("session.created"))["session"]["instructions"]
    await client.ws.disconnect()


async def test_a_key_client_cannot_take_a_reserved_unit(pool, key):
    first = (await post({}, key)).json()
    holder, _ = await open_socket(bearer(key))  # takes the unit that is not reserved
    created = await holder.until("session.created")
    reserved = (await ClientSecret.objects.aget(prefix=first["value"][:12])).unit_index
    assert (await units(pool))[1 - reserved].session_id == created["session"]["id"]
    refused, _ = await open_socket(bearer(key))  # one unit is idle, but reserved
    assert await refused_with(refused) == "session_limit_reached"
    owner, _ = await open_socket(bearer(first["value"]))
    assert (await owner.until("session.created"))["type"] == "session.created"
    for client in (holder, owner):
        await client.ws.disconnect()


async def test_a_full_cluster_answers_429_with_retry_after_and_an_openai_error(pool, key):
    assert [(await post({}, key)).status_code for _ in range(2)] == [200, 200]
    reply = await post({}, key)
    assert reply.status_code == 429 and int(reply.headers["Retry-After"]) > 0
    assert reply.json()["error"]["code"] == "session_limit_reached"
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


async def test_an_expired_secret_frees_its_unit_and_is_refused(pool, key):
    values = [(await post({"expires_after": {"seconds": 1}}, key)).json()["value"] for _ in range(2)]
    assert (await post({}, key)).status_code == 429
    await asyncio.sleep(1.2)
    assert (await post({}, key)).status_code == 200  # a freed unit is reserved again
    client, _ = await open_socket(bearer(key))  # and the other is free for key clients
    assert (await client.until("session.created"))["type"] == "session.created"
    expired, _ = await open_socket(bearer(values[0]))
    error = await expired.recv()
    assert error["error"]["code"] == "invalid_api_key" and "expired" in error["error"]["message"]
    await client.ws.disconnect()


async def test_a_secret_of_another_process_is_refused_and_names_where_to_connect(pool, key):
    other = await ServerProcess.objects.acreate(host="b", pid=1, pool_size=1, heartbeat_at=timezone.now(),
                                                public_url="wss://voice.example.com/b")
    await Unit.objects.acreate(process=other, index=0, state_since=timezone.now())
    mine = [(await post({}, key)).json() for _ in range(2)]  # the least loaded first: this one, then b
    assert sorted(s["connect_url"] for s in mine) == ["ws://testserver/v1/realtime",
                                                      "wss://voice.example.com/b/v1/realtime"]
    theirs = next(s for s in mine if "example" in s["connect_url"])
    assert theirs["calls_url"] == "https://voice.example.com/b/v1/realtime/calls"
    client, _ = await open_socket(bearer(theirs["value"]))
    error = await client.recv()
    assert error["error"]["code"] == "invalid_api_key" and "wss://voice.example.com/b" in error["error"]["message"]


async def test_silent_and_draining_processes_get_no_reservation(pool, key):
    silent = await ServerProcess.objects.acreate(host="c", pid=2, pool_size=1, public_url="ws://c",
                                                 heartbeat_at=timezone.now() - timedelta(minutes=1))
    draining = await ServerProcess.objects.acreate(host="d", pid=3, pool_size=1, public_url="ws://d",
                                                   heartbeat_at=timezone.now(), state=ProcessState.DRAINING)
    for process in (silent, draining):
        await Unit.objects.acreate(process=process, index=0, state_since=timezone.now())
    urls = [(await post({}, key)).json().get("connect_url") for _ in range(3)]
    assert urls == ["ws://testserver/v1/realtime"] * 2 + [None]


async def test_a_draining_process_admits_secrets_but_no_new_key_clients(pool, key):
    value = (await post({}, key)).json()["value"]
    pool.process_draining = True
    refused, _ = await open_socket(bearer(key))
    error = await refused.recv()
    assert error["error"]["code"] == "server_shutting_down"
    client, _ = await open_socket(bearer(value))
    assert (await client.until("session.created"))["type"] == "session.created"
    await client.ws.disconnect()


async def test_requests_are_checked_like_session_update(pool, key):
    cases = [
        ({"session": {"tempo": 3}}, 400, "unknown_parameter", "session.tempo"),
        ({"session": {"audio": {"input": {"transcription": {"language": "fr"}}}}}, 400, "unsupported_language",
         "session.audio.input.transcription.language"),
        ({"session": {"type": "transcription"}}, 400, "invalid_value", "session.type"),
        ({"expires_after": {"seconds": 0}}, 400, "invalid_value", "expires_after.seconds"),
        ({"expires_after": {"anchor": "now"}}, 400, "invalid_value", "expires_after.anchor"),
        ([1, 2], 400, "invalid_type", None),
        # Text no database can keep (once a 503 on PostgreSQL): refused, naming the field.
        ({"session": {"instructions": "a\u0000b"}}, 400, "invalid_value", "session.instructions"),
        ({"session": {"instructions": "\ud800"}}, 400, "invalid_value", "session.instructions"),
    ]
    for body, status, code, param in cases:
        reply = await post(body, key)
        assert reply.status_code == status and "error" in reply.json(), (body, reply.content)
        assert (reply.status_code, reply.json()["error"]["code"], reply.json()["error"]["param"]) == (
            status, code, param), body
    reply = await post(key=key, raw="{not json")
    assert (reply.status_code, reply.json()["error"]["code"]) == (400, "invalid_json")
    assert not await ClientSecret.objects.aexists()  # nothing reserved by a refused request
    assert (await post({}, key)).status_code == 200  # and the endpoint goes on


async def test_keys_are_required_and_their_session_limit_counts_unused_secrets(pool):
    assert (await post({})).json()["error"]["code"] == "missing_api_key"
    reply = await post({}, "s2s_no-such-key")
    assert (reply.status_code, reply.json()["error"]["code"]) == (401, "invalid_api_key")
    _, limited = await sync_to_async(APIKey.issue)("one at a time", max_sessions=1)
    assert (await post({}, limited)).status_code == 200
    reply = await post({}, limited)
    assert reply.status_code == 429 and "may hold 1" in reply.json()["error"]["message"]


async def test_a_logged_in_user_gets_a_secret_and_anyone_else_403(pool):
    browser = AsyncClient(enforce_csrf_checks=True)
    reply = await browser.post("/client_secret", data="{}", content_type="application/json")
    assert reply.status_code == 403
    user = await sync_to_async(User.objects.create_user)("ada", password="pw")
    await browser.aforce_login(user)
    reply = await browser.post("/client_secret", data="{}", content_type="application/json")
    assert reply.status_code == 403  # logged in, but no CSRF token
    page = await browser.get("/")
    token = page.cookies["csrftoken"].value
    reply = await browser.post("/client_secret", data="{}", content_type="application/json",
                               headers={"X-CSRFToken": token})
    assert reply.status_code == 200, reply.content
    assert (await ClientSecret.objects.aget()).user_id == user.pk


async def test_a_late_write_of_an_older_unit_state_never_overwrites_a_newer_one(pool):
    records, unit = pool.records, pool.units[0]
    claimed = pool.claim("sess_1")
    pool.release(claimed)
    assert records.flush()
    row = (await units(pool))[unit.index]
    assert (row.state, row.state_seq) == (UnitState.DRAINING, unit.state_seq)
    # The recorder writes the claim (seq 1) again, as a batch cut off by an outage would be.
    await sync_to_async(rows.unit_changed)(records.process_id, unit.index, UnitState.IDLE, UnitState.ACTIVE,
                                           "sess_1", timezone.now(), 1)
    assert (await units(pool))[unit.index].state == UnitState.DRAINING


async def test_a_keys_unused_secrets_count_against_its_sessions_on_every_path(pool):
    """max_sessions 1: a secret issued, then the same key connects directly: refused, as the
    secret holds the key's one session. The secret then opens it."""
    _, limited = await sync_to_async(APIKey.issue)("one at a time", max_sessions=1)
    value = (await post({}, limited)).json()["value"]
    direct, _ = await open_socket(bearer(limited))
    assert await refused_with(direct) == "session_limit_reached"
    client, _ = await open_socket(bearer(value))
    assert (await client.until("session.created"))["type"] == "session.created"
    assert (await post({}, limited)).status_code == 429  # the session holds it now
    await client.ws.disconnect()


async def test_a_secret_refused_after_it_was_redeemed_frees_its_unit(pool, key, settings):
    settings.S2S = {**settings.S2S, "CONNECTS_PER_MINUTE": 1}
    value = (await post({}, key)).json()["value"]
    address = ("198.51.100.23", 50000)  # an address of its own: the limit counts per address
    first, _ = await open_socket(bearer(key), client=address)  # its one connect this minute
    await first.until("session.created")
    refused, _ = await open_socket(bearer(value), client=address)
    assert await refused_with(refused) == "rate_limit_exceeded"
    assert [u.reserved_until for u in (await units(pool)).values()] == [None, None]
    await first.ws.disconnect()


async def test_a_secret_whose_unit_is_gone_gets_another_and_frees_the_reservation(pool, key):
    value = (await post({}, key)).json()["value"]
    reserved = (await ClientSecret.objects.aget(prefix=value[:12])).unit_index
    with pool._lock:  # its unit did not drain in time since the secret was issued
        pool._set_state(pool.units[reserved], UnitState.QUARANTINED, "sess_old")
    client, _ = await open_socket(bearer(value))
    created = await client.until("session.created")
    assert pool.units[1 - reserved].session_id == created["session"]["id"]
    assert pool.records.flush()
    assert (await units(pool))[reserved].reserved_until is None
    await client.ws.disconnect()


async def test_a_revoked_keys_secret_no_longer_connects(pool):
    api_key, revoked = await sync_to_async(APIKey.issue)("soon revoked")
    value = (await post({}, revoked)).json()["value"]
    api_key.revoked_at = timezone.now()
    await api_key.asave()
    client, _ = await open_socket(bearer(value))
    assert await refused_with(client) == "invalid_api_key"


async def test_without_a_key_a_user_holds_few_short_secrets(pool):
    browser = AsyncClient()
    await browser.aforce_login(await sync_to_async(User.objects.create_user)("bo", password="pw"))

    async def ask(body):
        return await browser.post("/client_secret", data=json.dumps(body), content_type="application/json")

    reply = await ask({"expires_after": {"seconds": 3600}})  # past USER_CLIENT_SECRET_SECONDS (60)
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, "expires_after.seconds")
    first = (await ask({})).json()
    assert abs(first["expires_at"] - (timezone.now().timestamp() + 60)) < 5
    assert (await ask({})).status_code == 200
    reply = await ask({})  # CLIENT_SECRETS_PER_USER (2) unused at once
    assert reply.status_code == 429 and "2 unused client secrets" in reply.json()["error"]["message"]


async def test_every_failure_of_the_endpoint_is_an_openai_error(pool, key, settings):
    reply = await AsyncClient().get(URL, headers={"Authorization": f"Bearer {key}"})
    assert (reply.status_code, reply.json()["error"]["code"]) == (405, "method_not_allowed")
    reply = await post(key=key, raw="[" * 100_000)
    assert (reply.status_code, reply.json()["error"]["code"]) == (400, "invalid_json")
    reply = await post({"session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": []}}}}},
                       key)
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, "session.audio.input.turn_detection.eagerness")
    reply = await post({"session": []}, key)
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, "session")
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    reply = await post({"session": {"instructions": "x" * 2000}}, key)
    assert (reply.status_code, reply.json()["error"]["code"]) == (413, "request_too_large")


def test_a_drained_pool_stops_only_when_nothing_is_live(pool):
    unit = pool.claim("sess_live")
    assert not pool.close_if_settled() and pool.accepting  # a session is live: go on
    pool.release(unit)
    assert pool.wait_settled(5) and pool.close_if_settled() and not pool.accepting
    assert pool.claim("sess_late") is None  # and from then on no claim succeeds
