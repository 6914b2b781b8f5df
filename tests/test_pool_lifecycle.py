"""Unit lifecycle, session records and the admin pool console, on the scripted backend."""

import asyncio
import gc
import json
import os
import re
import threading
import time
import weakref
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Permission, User
from django.db.backends.signals import connection_created
from django.test import Client as HttpClient
from django.utils import timezone

from pool.access import database
from pool.backends.scripted import SCRIPT
from pool.conf import DEFAULTS, get_config
from pool.history.recorder import NoRecords, Records
from pool.models import ServerProcess, Session, Unit
from pool.pipeline.registry import PoolRegistry
from pool.process import build_registry
from pool.states import EndReason, ProcessState, SessionState, UnitState
from pool.testing import wait_until
from realtime.session.lifecycle import LIVE

from .helpers import user_text


async def wait_for(predicate, timeout=5.0):
    """``pool.testing.wait_until`` from a coroutine (``predicate`` runs on a worker thread)."""
    return await asyncio.to_thread(wait_until, predicate, timeout, "the condition", 0.02)


def unit_state(registry, index=0):
    return registry.snapshot()[index]["state"]


def staff(username, release=False):
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=[
        "view_unit", "view_quarantinedunit", "view_session", "view_serverprocess"]))
    if release:
        user.user_permissions.add(Permission.objects.get(codename="release_unit"))
    return user


def post_overview_release(username, unit_pk):
    """Log in, load the pool overview, post its Release button with the CSRF token."""
    browser = HttpClient(enforce_csrf_checks=True)
    assert browser.login(username=username, password="pw")
    page = browser.get("/admin/pool/serverprocess/overview/")
    assert page.status_code == 200
    return browser.post("/admin/pool/serverprocess/overview/", {
        "unit": str(unit_pk), "csrfmiddlewaretoken": browser.cookies["csrftoken"].value}, follow=True)


def post_release_action(username, unit_pk):
    """Log in, load the quarantined-units page, post the Release action with its CSRF token."""
    browser = HttpClient(enforce_csrf_checks=True)
    assert browser.login(username=username, password="pw")
    page = browser.get("/admin/pool/quarantinedunit/")
    assert page.status_code == 200
    token = browser.cookies["csrftoken"].value
    reply = browser.post("/admin/pool/quarantinedunit/", {
        "action": "release_units", "_selected_action": [str(unit_pk)], "csrfmiddlewaretoken": token,
    }, follow=True)
    assert reply.status_code == 200
    return reply


async def test_wedged_unit_quarantined_then_released_by_an_operator_restores_capacity(recorded_pool, connect):
    SCRIPT.wedge.set()
    client = await connect()
    created = await client.until("session.created")
    session_id = created["session"]["id"]
    await client.send({"type": "response.create"})
    await client.until("response.created")
    await wait_for(lambda: SCRIPT.requests)  # the LLM stage is inside generate, wedged
    await client.ws.disconnect()  # mid-response
    await wait_for(lambda: unit_state(recorded_pool) == "quarantined", timeout=5)

    # While quarantined, the unit is never claimed.
    refused = await connect()
    assert (await refused.recv())["error"]["code"] == "session_limit_reached"
    await refused.ws.disconnect()

    assert recorded_pool.records.flush()
    row = await Session.objects.aget(session_id=session_id)
    assert row.state == SessionState.QUARANTINED and row.quarantined_at and row.end_reason == "client_close"
    assert row.release_after is not None and row.drained_at is None
    unit_row = await Unit.objects.aget(process_id=recorded_pool.records.process_id, index=0)
    assert unit_row.state == UnitState.QUARANTINED

    await asyncio.to_thread(staff, "watcher")
    await asyncio.to_thread(staff, "operator", True)
    reply = await asyncio.to_thread(post_release_action, "watcher", unit_row.pk)
    assert unit_state(recorded_pool) == "quarantined"  # staff without release_unit cannot
    assert b"released" not in reply.content
    reply = await asyncio.to_thread(post_overview_release, "watcher", unit_row.pk)
    assert reply.status_code == 403 and unit_state(recorded_pool) == "quarantined"
    # The operator releases it from the pool overview (the quarantined-units action does the same).
    reply = await asyncio.to_thread(post_overview_release, "operator", unit_row.pk)
    assert b"released: fresh handler threads" in reply.content
    assert unit_state(recorded_pool) == "idle"

    assert recorded_pool.records.flush()
    row = await Session.objects.select_related("released_by").aget(session_id=session_id)
    assert row.state == SessionState.RELEASED and row.released_by.username == "operator" and row.released_at
    # The old wedged thread is abandoned; the fresh unit completes a turn.
    SCRIPT.wedge.clear()
    client = await connect()
    await client.until("session.created")
    await client.send({"type": "response.create"})
    assert (await client.until("response.done"))["response"]["status"] == "completed"
    await client.ws.disconnect()


async def test_session_row_records_the_life_of_a_session(recorded_pool, connect):
    client = await connect()
    session_id = (await client.until("session.created"))["session"]["id"]
    await client.send(user_text("hi"))
    await client.send({"type": "response.create"})
    await client.until("response.done")
    await client.send({"type": "response.cancel"})
    await client.until("error")
    await client.ws.disconnect()
    await wait_for(lambda: unit_state(recorded_pool) == "idle")
    assert recorded_pool.records.flush()
    row = await Session.objects.aget(session_id=session_id)
    assert row.state == SessionState.ENDED
    assert row.created_at <= row.ended_at <= row.drained_at < row.release_after
    assert (row.responses, row.errors, row.turns) == (1, 1, 0)
    assert row.audio_out_seconds > 0
    assert row.last_error.startswith("response_cancel_not_active")
    assert row.process_id == recorded_pool.records.process_id


async def test_idle_session_is_closed_with_an_error_and_a_normal_close(recorded_pool, connect, settings):
    settings.S2S = {**settings.S2S, "IDLE_TIMEOUT_SECONDS": 0.3}
    client = await connect()
    session_id = (await client.until("session.created"))["session"]["id"]
    error = await client.until("error", timeout=3)
    assert error["error"]["code"] == "idle_timeout"
    assert await client.ws.receive_output(2) == {"type": "websocket.close", "code": 1000}
    await client.ws.disconnect()
    await wait_for(lambda: unit_state(recorded_pool) == "idle")
    assert recorded_pool.records.flush()
    row = await Session.objects.aget(session_id=session_id)
    assert (row.end_reason, row.close_code) == ("idle_timeout", 1000)


async def test_a_failing_stage_fails_the_response_and_its_thread_lives_on(recorded_pool, connect):
    SCRIPT.tts_error = RuntimeError("synthesizer exploded")
    client = await connect()
    session_id = (await client.until("session.created"))["session"]["id"]
    await client.send({"type": "response.create"})
    error = await client.until("error")
    assert error["error"]["code"] == "stage_failed" and "synthesizer exploded" in error["error"]["message"]
    assert (await client.until("response.done"))["response"]["status"] == "failed"
    SCRIPT.tts_error = None
    await asyncio.sleep(0.2)
    await client.send({"type": "response.create"})
    assert (await client.until("response.done"))["response"]["status"] == "completed"
    await client.ws.disconnect()
    await wait_for(lambda: unit_state(recorded_pool) == "idle")
    assert recorded_pool.records.flush()
    row = await Session.objects.aget(session_id=session_id)
    assert row.stage_failures >= 1 and row.responses == 2


async def test_session_values_never_leak_to_the_next_session_on_the_unit(recorded_pool, connect):
    client = await connect()
    defaults = (await client.until("session.created"))["session"]
    await client.send({"type": "session.update", "session": {
        "instructions": "Talk like a pirate.", "output_modalities": ["text"],
        "audio": {"input": {"turn_detection": {"threshold": 0.95, "silence_duration_ms": 1200}},
                  "output": {"voice": "echo", "speed": 1.4}}}})
    await client.until("session.updated")
    await client.send(user_text("secret"))
    await client.until("conversation.item.done")
    await client.ws.disconnect()
    await wait_for(lambda: unit_state(recorded_pool) == "idle")
    client = await connect()
    fresh = (await client.until("session.created"))["session"]
    assert {k: v for k, v in fresh.items() if k != "id"} == {k: v for k, v in defaults.items() if k != "id"}
    await client.send({"type": "response.create"})
    await client.until("response.done")
    assert all("secret" not in m["content"] for m in SCRIPT.requests[-1].messages)
    assert "pirate" not in SCRIPT.requests[-1].messages[0]["content"]
    await client.ws.disconnect()


def _names():
    # Left out: the bounded executors, which start their threads as they are needed: the event
    # loop's (asyncio.to_thread, "asyncio_N"), the connects' database threads (pool.access.database,
    # at most THREADS), and unnamed ones ("ThreadPoolExecutor-N_M": asgiref's sync_to_async
    # starts one lazily); and the workers of the shared models' queues (pool.pipeline.compute):
    # one per loaded model, not per session, ending when an earlier test's model is collected
    # (tests/test_compute.py), as Silero's batch thread does ("vad-batch", pool.backends.vad).
    # Every thread of ours is named.
    names = [t.name for t in threading.enumerate() if not t.name.startswith(("compute-", "vad-batch"))]
    assert sum(name.startswith(database.THREAD_PREFIX) for name in names) <= database.THREADS
    return sorted(name for name in names if not name.startswith(("asyncio_", "ThreadPoolExecutor-",
                                                                  database.THREAD_PREFIX)))


def _threads():
    """Thread names once the threads that are ending have ended (a cancelled drain deadline, a
    Timer, exits a moment later). Seen in CI: a baseline that held the warm-up's Timer."""
    deadline = time.monotonic() + 10
    while True:
        names = _names()
        time.sleep(0.3)
        timers = any(isinstance(t, threading.Timer) for t in threading.enumerate())
        if (names == _names() and not timers) or time.monotonic() > deadline:
            return names


def _fds():
    return len(os.listdir("/proc/self/fd"))


async def test_300_sessions_leave_no_threads_fds_or_stray_rows(recorded_pool, connect):
    append = {"type": "input_audio_buffer.append", "audio": "AAAAAAAAAAAAAAAA"}

    async def cycle():
        client = await connect()
        await client.until("session.created")
        await client.send(append)
        await client.ws.disconnect()
        await wait_for(lambda: unit_state(recorded_pool) == "idle")

    await cycle()  # warm up lazily created resources
    threads, fds = await asyncio.to_thread(_threads), _fds()
    for _ in range(300):
        await cycle()
    await asyncio.sleep(0.2)
    assert recorded_pool.records.flush(timeout=30)
    assert await asyncio.to_thread(_threads) == threads
    assert _fds() <= fds + 2
    process = recorded_pool.records.process_id
    assert await Session.objects.filter(process_id=process).acount() == 301
    assert await Session.objects.filter(process_id=process).exclude(state=SessionState.ENDED).acount() == 0
    assert await Unit.objects.filter(process_id=process).acount() == 1


async def test_an_ended_session_is_freed_at_once_not_at_the_next_full_garbage_collection(
        scripted_pool, connect):
    """A session's memory (its conversation, the events a slow client never read) goes when it
    ends. It used to wait in reference cycles (consumer <-> its tasks, session <-> turn-taking,
    the unit's context -> consumer) for a full collection, which a busy server makes rarely:
    RSS grew by about 1.4 MB per client that never read."""
    client = await connect()
    await client.until("session.created")
    await client.send(user_text("x" * 100_000))
    await client.send({"type": "response.create"})
    await client.until("response.output_audio.delta")
    live = next(iter(LIVE))
    gone = [weakref.ref(live), weakref.ref(live.session), weakref.ref(live.session.conversation)]
    del live
    gc.collect()
    gc.disable()
    try:
        await client.ws.disconnect()  # mid-reply, with events unsent
        await wait_for(lambda: unit_state(scripted_pool) == "idle")
        await asyncio.sleep(0.1)
        assert [ref() is None for ref in gone] == [True, True, True]
    finally:
        gc.enable()


@pytest.mark.django_db
def test_admin_pages_render_with_units_in_every_state(admin_client):
    now = timezone.now()
    process = ServerProcess.objects.create(host="h", pid=1, pool_size=4, heartbeat_at=now)
    for index, state in enumerate(["idle", "active", "draining", "quarantined"]):
        Unit.objects.create(process=process, index=index, state=state, session_id=f"sess_{index}",
                            state_since=now - timedelta(seconds=42), input_lag_max_ms=index * 10.0)
        Session.objects.create(session_id=f"sess_{index}", process=process, unit_index=index,
                               created_at=now, state={"idle": "ended"}.get(state, state))
    pages = ["/admin/pool/unit/", "/admin/pool/quarantinedunit/", "/admin/pool/session/",
             "/admin/pool/serverprocess/", "/admin/pool/session/?state__exact=quarantined",
             f"/admin/pool/session/{Session.objects.first().pk}/change/", "/admin/"]
    for page in pages:
        assert admin_client.get(page).status_code == 200, page
    pool_page = admin_client.get("/admin/pool/unit/").content.decode()
    assert pool_page.count("quarantined") >= 1 and "#c62828" in pool_page
    assert admin_client.get("/admin/pool/quarantinedunit/").context["cl"].result_count == 1
    overview = admin_client.get("/admin/pool/serverprocess/overview/").content.decode()
    assert all(f"unit {i}" in overview and f"sess_{i}" in overview for i in range(4))
    # 42 s and what rendering the pages took (seconds on a loaded 2-core machine)
    assert re.search(r"for 4[2-9] s", overview) and "input lag 30 ms" in overview
    assert overview.count('value="Release"') == 1  # on the quarantined unit only
    ServerProcess.objects.update(state=ProcessState.STOPPED)
    assert "No running process" in admin_client.get("/admin/pool/serverprocess/overview/").content.decode()


@pytest.mark.django_db
def test_pool_status_is_for_staff_or_the_token(client, admin_client, settings, scripted_pool):
    settings.S2S = {**settings.S2S, "STATUS_TOKEN": "s3cret"}
    assert client.get("/v1/pool").status_code == 403
    assert client.get("/v1/pool", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    status = client.get("/v1/pool", HTTP_AUTHORIZATION="Bearer s3cret").json()
    assert status["pool_size"] == 2 and [u["state"] for u in status["units"]] == ["idle", "idle"]
    assert admin_client.get("/v1/pool").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_processes_that_stopped_heart_beating_are_lost_with_their_sessions():
    """A lost session ended at its process's last heartbeat (its last sign of life), not when the
    silence was noticed; one that began after that beat, when it began."""
    started = timezone.now() - timedelta(minutes=5)
    last_beat = started + timedelta(seconds=7)
    crashed = ServerProcess.objects.create(host="h", pid=2, pool_size=1, heartbeat_at=last_beat)
    Session.objects.create(session_id="sess_open", process=crashed, unit_index=0, created_at=started)
    late = last_beat + timedelta(seconds=2)
    Session.objects.create(session_id="sess_late", process=crashed, unit_index=1, created_at=late)
    records = Records(release_after=10, heartbeat_seconds=60, lost_after_seconds=30)
    records.start([])
    try:
        crashed.refresh_from_db()
        row = Session.objects.get(session_id="sess_open")
        assert crashed.state == ProcessState.LOST and crashed.stopped_at == last_beat
        assert (row.state, row.end_reason) == (SessionState.LOST, EndReason.LOST)
        assert row.ended_at == last_beat and row.duration == 7.0
        assert Session.objects.get(session_id="sess_late").ended_at == late
    finally:
        records.stop()
    assert ServerProcess.objects.get(pk=records.process_id).state == ProcessState.STOPPED


@pytest.mark.django_db(transaction=True)
def test_a_read_only_database_is_logged_once_and_caught_up_when_writable(caplog):
    """SQLite's query_only refuses writes as a read-only file or a full disk would (root ignores
    file modes, so chmod cannot do it here); the recorder's connections get it while it is set."""
    read_only = threading.Event()
    read_only.set()

    def on_connect(sender, connection, **kwargs):
        if read_only.is_set() and threading.current_thread().name == "pool-records":
            connection.cursor().execute("PRAGMA query_only = 1")

    connection_created.connect(on_connect)
    records = Records(release_after=10, heartbeat_seconds=0.2)
    records.start([])
    try:
        for i in range(20):
            records.session_started(f"sess_ro_{i}", 0)
            time.sleep(0.1)  # two seconds of refused writes and heartbeats
        assert not Session.objects.filter(session_id__startswith="sess_ro_").exists()
        read_only.clear()
        assert records.flush(timeout=15)
        assert Session.objects.filter(session_id__startswith="sess_ro_").count() == 20
    finally:
        records.stop()
        connection_created.disconnect(on_connect)
    refused = [r.getMessage() for r in caplog.records if "refused a write" in r.getMessage()]
    assert len(refused) == 1 and "readonly" in refused[0]
    assert sum("the database is back" in r.getMessage() for r in caplog.records) == 1


def test_a_pool_shut_down_during_a_drain_quarantines_nothing_afterwards(settings, caplog):
    """A drain's deadline outlived its pool: 2 s after a test's pool was shut down mid-drain, it
    quarantined that pool's unit while the next test ran (and its timer thread was counted)."""
    settings.S2S = {"BACKEND": "scripted", "POOL_SIZE": 1, "RELEASE_AFTER_SECONDS": 0.3}
    registry = build_registry(get_config(), record=False)
    unit = registry.claim("sess_drain")
    unit.begin(lambda event: None)
    unit.stop()  # its stages are gone: the drain cannot end
    registry.release(unit)
    registry.shutdown()
    time.sleep(0.6)
    assert unit.state == UnitState.DRAINING
    assert "did not drain" not in caplog.text
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()]


@pytest.mark.django_db(transaction=True)
def test_heartbeats_write_each_units_input_lag_when_it_changes():
    units = [SimpleNamespace(index=i, state="active", input_lag_max=0.0) for i in range(2)]
    records = Records(release_after=10, heartbeat_seconds=0.1)
    records.start(units)
    try:
        units[1].input_lag_max = 0.0456  # seconds an append waited for the VAD

        def lags():
            return dict(Unit.objects.filter(process_id=records.process_id).values_list("index", "input_lag_max_ms"))

        wait_until(lambda: lags() == {0: 0.0, 1: 45.6}, 5, "the input lags written")
    finally:
        records.stop()


EVERY_SESSION_VALUE = {
    "instructions": "Only ever say 'arr'.",
    "output_modalities": ["text"],
    "max_output_tokens": 3,
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
    "tool_choice": "required",
    "tracing": "auto",
    "prompt": {"id": "pmpt_1"},
    "include": ["item.input_audio_transcription.logprobs"],
    "truncation": "disabled",
    "audio": {
        "input": {
            "format": {"type": "audio/pcmu"},
            "transcription": {"model": "other", "language": "de", "prompt": "p"},
            "noise_reduction": {"type": "near_field"},
            "turn_detection": {"type": "server_vad", "threshold": 0.95, "prefix_padding_ms": 0,
                               "silence_duration_ms": 2000, "create_response": False,
                               "interrupt_response": False, "idle_timeout_ms": 6000},
        },
        "output": {"format": {"type": "audio/pcma"}, "voice": "echo", "speed": 1.5},
    },
}


async def test_every_session_update_value_is_reset_for_the_next_session(recorded_pool, connect):
    client = await connect()
    defaults = (await client.until("session.created"))["session"]
    await client.send({"type": "session.update", "session": EVERY_SESSION_VALUE})
    updated = (await client.until("session.updated"))["session"]
    for key in EVERY_SESSION_VALUE:
        assert updated[key] != defaults[key], key
    await client.ws.disconnect()
    await wait_for(lambda: unit_state(recorded_pool) == "idle")

    client = await connect()
    fresh = (await client.until("session.created"))["session"]
    assert {k: v for k, v in fresh.items() if k != "id"} == {k: v for k, v in defaults.items() if k != "id"}
    # and the unit behaves as new: PCM16 in, audio out, a full response, server VAD turn
    from .helpers import speech_appends

    for append in speech_appends():
        await client.send(append)
    # default server VAD: JFK's pauses end turns, and a later turn may barge in on an answer
    while (done := await client.until("response.done", timeout=30))["response"]["status"] != "completed":
        assert done["response"]["status_details"]["reason"] == "turn_detected"
    assert done["response"]["output"][0]["type"] == "message"
    assert "response.output_audio.delta" in client.types()
    request = SCRIPT.requests[-1]
    assert request.tools == [] and request.max_output_tokens > 3
    # The default instructions, and the turn's language as the (scripted, multilingual) STT
    # detected it: the first session's "de" is gone.
    assert request.messages[0]["content"] == (f"{DEFAULTS['VOICE_STYLE']}\n\n{defaults['instructions']}\n\n"
                                              "The user speaks English. Answer in English.")
    await client.ws.disconnect()


async def test_health_check_is_answered_without_django(scripted_pool):
    from channels.testing import HttpCommunicator

    from s2s_project.asgi import application

    reply = await HttpCommunicator(application, "GET", "/healthz").get_response()
    assert reply["status"] == 200
    assert json.loads(reply["body"]) == {"status": "ok", "pool_size": 2, "idle": 2}


@pytest.mark.parametrize(("tts_speed", "size", "warned"), [(2.4, 4, True), (2.4, 2, False), (0.8, 1, True),
                                                          (None, 64, False)])
def test_a_pool_larger_than_the_replies_its_cpu_speaks_at_once_is_named_at_start(settings, caplog, tts_speed,
                                                                                   size, warned):
    """An operator who sets POOL_SIZE 4 on a CPU whose TTS speaks 2.4 s of audio a second hears,
    at start, that a third reply at the same moment waits; a TTS that was not timed says nothing."""
    settings.S2S = {"BACKEND": "scripted", "POOL_SIZE": 1}
    scripted = build_registry(get_config(), record=False)
    scripted.shutdown()
    registry = PoolRegistry(replace(scripted.backends, tts_speed=tts_speed), size, 1.0, NoRecords())
    registry.shutdown()
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "replies at the same moment" in r.getMessage()]
    assert bool(said) == warned, said
    if warned:
        assert f"A pool of {size} units" in said[0] and f"more than {int(tts_speed)} replies" in said[0]
