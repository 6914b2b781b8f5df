"""No client input can make a record fail: what the protocol accepts fits the columns, every text
is made storable by one function (``pool.history.storable``), and on SQLite and PostgreSQL the history of
a session holds what its client was shown, whatever unicode and lengths the client sent."""

import asyncio
import contextlib
import json
import sqlite3
import urllib.request

import psycopg
import pytest
import websockets
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pool.history.storable import TEXT_LIMIT, storable, storable_json
from pool.models import ConversationItem, Session
from pool.testing import LiveServer, postgres_database, wait_until
from realtime import schema, session_config
from realtime.session.history import item_text


def test_storable_removes_nul_replaces_lone_surrogates_and_bounds_the_length():
    assert storable("a\x00b") == "ab"
    assert storable("x\ud800y\udfff") == "x\ufffdy\ufffd"
    assert storable("\U0001f600" * 3, 2) == "\U0001f600" * 2  # a code point is never split
    assert storable("abc" * TEXT_LIMIT) == ("abc" * TEXT_LIMIT)[:TEXT_LIMIT]
    assert storable_json({"k\x00": ["\ud83d", 1, None, {"t": "ok"}]}) == {"k": ["\ufffd", 1, None, {"t": "ok"}]}
    for text in ("plain", "caf\u00e9", "\U0001f600"):
        assert storable(text) == text


def test_what_the_protocol_accepts_fits_the_columns():
    column = ConversationItem._meta.get_field
    assert schema.MAX_ID_CHARS <= column("item_id").max_length
    assert session_config.MAX_VOICE_CHARS <= column("voice").max_length
    statuses = schema.Status.__args__
    assert max(map(len, statuses)) <= column("status").max_length
    roles = schema.MessageItem.__annotations__["role"].__args__[0].__args__
    assert max(map(len, roles)) <= column("role").max_length
    assert max(map(len, schema.ITEM_TYPES + ("error",))) <= column("kind").max_length
    assert Session._meta.get_field("session_id").max_length >= len("sess_") + 22


# --- arbitrary client text, stored on both databases -------------------------------------------

# Any code point, surrogates included, and often the ones that break a database: NUL, unpaired
# surrogates (each half of an emoji), a character outside the BMP, an accented letter.
chars = st.sampled_from(["\x00", "\ud800", "\udfff", "\ud83d", "\U0001f600", "\u00e9", "a"]) | st.characters(
    exclude_categories=())
anything = st.text(chars, max_size=40)
long_text = st.builds(lambda s, n: s * n, st.text(chars, min_size=1, max_size=3), st.integers(1, 6000))
texts = anything | long_text
ids = st.none() | anything


def _message(role, part, text, item_id):
    item = {"type": "message", "role": role, "content": [{"type": part, "text" if "text" in part else "transcript": text}]}
    return item if item_id is None else {**item, "id": item_id}


client_events = st.one_of(
    st.builds(lambda t, i: {"type": "conversation.item.create", "item": _message("user", "input_text", t, i)}, texts, ids),
    st.builds(lambda t, i: {"type": "conversation.item.create", "item": _message("assistant", "output_audio", t, i)},
              texts, ids),
    st.builds(lambda c, n, a: {"type": "conversation.item.create", "item": {
        "type": "function_call", "call_id": c, "name": n, "arguments": a}}, anything, anything, texts),
    st.builds(lambda c, o: {"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": c, "output": o}}, anything, texts),
    st.builds(lambda i: {"type": "conversation.item.delete", "item_id": i}, anything),
    st.builds(lambda v, t: {"type": "session.update", "session": {"instructions": t, "audio": {"output": {"voice": v}}}},
              anything, texts),
    st.builds(lambda t: {"type": t}, anything),
    st.builds(lambda k, e: {"type": "input_audio_buffer.clear", k: 1, "event_id": e}, anything, anything),
)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storing_server(request, tmp_path_factory):
    """A live server on the scripted backend, storing on SQLite or on a PostgreSQL database of
    its own; yields ``(server, rows(session_id))``."""
    with contextlib.ExitStack() as stack:
        env = {"S2S_BACKEND": "scripted", "S2S_JSON": json.dumps({"CONNECTS_PER_MINUTE": None})}
        if request.param == "postgres":
            url = stack.enter_context(postgres_database())
            env["DATABASE_URL"] = url

            def query(sql, *args):
                with psycopg.connect(url) as db:
                    return db.execute(sql.replace("?", "%s"), args).fetchall()
        else:
            def query(sql, *args):
                with sqlite3.connect(server.db) as db:
                    return db.execute(sql, args).fetchall()
        server = stack.enter_context(LiveServer(tmp_path_factory.mktemp(request.param), env=env))
        yield server, query


async def _shown(server, events):
    """Send ``events`` on one session; returns its id and every server event it was shown."""
    async with websockets.connect(f"{server.base_url}/realtime", max_size=None) as ws:
        session_id = json.loads(await ws.recv())["session"]["id"]
        for i, event in enumerate(events):
            await ws.send(json.dumps(event))
            await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "item_nowhere",
                                      "event_id": f"end_{i}"}))
        shown, ends = [], 0
        while ends < len(events):
            shown.append(json.loads(await ws.recv()))
            ends += str((shown[-1].get("error") or {}).get("event_id")).startswith("end_")
    return session_id, shown


@pytest.mark.live
@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=st.lists(client_events, min_size=1, max_size=4))
def test_the_history_holds_what_the_client_was_shown_and_every_session_ends(storing_server, events):
    server, query = storing_server
    session_id, shown = asyncio.run(_shown(server, events))
    expected = {}
    for event in shown:
        if event["type"] == "conversation.item.done":
            item = event["item"]
            expected[storable(item["id"])] = ("message" if item["type"] == "message" else item["type"],
                                    storable(item_text(item)), storable_json(item))
        elif event["type"] == "error":
            error = event["error"]
            expected[event["event_id"]] = ("error", storable(f"{error['code']}: {error['message']}"),
                                           storable_json(error))

    def ended():
        return query("select ended_at from pool_session where session_id = ? and ended_at is not null", session_id)

    wait_until(ended, 10, "the session's row ends", 0.05)
    wait_until(lambda: query("select count(*) from pool_conversationitem where session_id = ?", session_id)[0][0]
               >= len(expected), 10, "every history row is written", 0.05)
    rows = query("select item_id, kind, text, data from pool_conversationitem where session_id = ?", session_id)
    stored = {item_id: (kind, text, json.loads(data) if isinstance(data, str) else data)
              for item_id, kind, text, data in rows}
    assert stored == expected

    def idle():
        with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=5) as reply:
            return json.loads(reply.read())["idle"] == 1

    wait_until(idle, 10, "the unit is idle again", 0.05)
