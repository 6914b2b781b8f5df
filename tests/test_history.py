"""The session history: what a session leaves in the database (its conversation, the errors it
was sent, each response with its timings), how the admin shows it, and how it is pruned.

Scripted test backend (real Silero VAD on jfk.flac; scripted STT, LLM and TTS), recorded to the
test database by the real recorder thread.
"""

import asyncio
import json
from datetime import timedelta
from io import StringIO

import numpy as np
import pytest
import soundfile
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.core.management import call_command
from django.test import Client as HttpClient
from django.utils import timezone

from pool.backends.scripted import SCRIPT
from pool.models import APIKey, ConversationItem, Session, SessionResponse
from pool.pipeline.timings import FIELDS
from pool.testing import wait_until

from .helpers import appends, jfk_segment, open_socket, silence, user_text

QUESTION = (0.0, 2.6)  # "And so my fellow Americans", then a pause (test_turn_taking)


def admin_browser():
    User.objects.filter(username="root").exists() or User.objects.create_superuser("root", password="pw")
    browser = HttpClient()
    assert browser.login(username="root", password="pw")
    return browser


async def a_conversation(client):
    """A spoken turn answered, a bad event, a text turn whose reply the client cancels after
    its first audio. Returns the items the client was shown, by id."""
    SCRIPT.transcript = "What should I ask my country?"
    for append in appends(np.concatenate([jfk_segment(*QUESTION), silence(1.5)])):
        await client.send(append)
    done = await client.until("response.done", timeout=30)
    assert done["response"]["status"] == "completed"
    await client.send({"type": "session.update", "session": {"audio": {"output": {"speed": 99}}}})
    assert (await client.until("error"))["error"]["code"] == "invalid_value"
    SCRIPT.token_delay = 0.05  # a reply that takes a while
    await client.send(user_text("Tell me a long story."))
    await client.send({"type": "response.create"})
    await client.until("response.output_audio.delta")
    await client.send({"type": "response.cancel"})
    cancelled = await client.until("response.done")
    assert cancelled["response"]["status"] == "cancelled"
    await asyncio.sleep(0.2)
    shown = {}
    for event in client.received:
        if event["type"] in ("conversation.item.added", "conversation.item.done", "response.output_item.done"):
            shown[event["item"]["id"]] = event["item"]
        elif event["type"] == "conversation.item.input_audio_transcription.completed":
            shown[event["item_id"]]["content"][0]["transcript"] = event["transcript"]
    return shown, done["response"]["id"], cancelled["response"]["id"]


async def test_a_session_keeps_its_conversation_errors_and_turn_timings(recorded_pool, connect):
    client = await connect()
    session_id = (await client.until("session.created"))["session"]["id"]
    shown, answered_id, cancelled_id = await a_conversation(client)
    await client.ws.disconnect()
    await asyncio.sleep(0.2)
    assert recorded_pool.records.flush()

    items = [item async for item in ConversationItem.objects.filter(session_id=session_id)]
    assert [(i.kind, i.role) for i in items] == [
        ("message", "user"), ("message", "assistant"), ("error", ""), ("message", "user"), ("message", "assistant")]
    spoken, reply, error, typed, cut = items
    assert spoken.text == SCRIPT.transcript and spoken.audio_start_ms < spoken.audio_end_ms
    assert reply.text == SCRIPT.reply and reply.voice == "alloy" and not reply.interrupted
    assert reply.response_id == answered_id and reply.audio_ms > 0
    assert error.text.startswith("invalid_value: ") and error.data["param"] == "session.audio.output.speed"
    assert typed.text == "Tell me a long story."
    assert cut.interrupted and cut.status == "incomplete" and len(cut.text) < len(SCRIPT.reply)
    assert [i.at_ms for i in items] == sorted(i.at_ms for i in items)
    # Every item is kept in the Realtime API's shape, as the client was last shown it.
    for item in items:
        if item.kind != "error":
            assert item.data == shown[item.item_id]

    rows = {r.response_id: r async for r in SessionResponse.objects.filter(session_id=session_id)}
    voice_turn = rows[answered_id]
    assert voice_turn.status == "completed" and voice_turn.output_tokens > 0
    # The stages' marks in order; with a speculative reply (started at the pause, adopted at the
    # commit) they come before the end of speech, and the first audio goes out when it is adopted.
    stages = [voice_turn.llm_start_ms, voice_turn.llm_first_text_ms, voice_turn.llm_first_phrase_ms,
              voice_turn.tts_first_audio_ms]
    assert None not in stages and stages == sorted(stages)
    assert 0 <= voice_turn.committed_ms <= voice_turn.response_created_ms <= voice_turn.first_audio_sent_ms
    assert voice_turn.tts_first_audio_ms <= voice_turn.first_audio_sent_ms
    assert voice_turn.stt_compute_ms is not None and voice_turn.tts_first_compute_ms is not None
    text_turn = rows[cancelled_id]  # no speech ended it: no turn timings
    assert (text_turn.status, text_turn.reason) == ("cancelled", "client_cancelled")
    assert all(getattr(text_turn, name) is None for name in FIELDS if name != "stt_speculative")

    row = await Session.objects.aget(session_id=session_id)
    assert (row.turns, row.responses, row.completed_responses, row.cancelled_responses) == (1, 2, 1, 1)
    assert row.first_audio_p50_ms == voice_turn.first_audio_sent_ms and row.history_dropped == 0
    assert not row.user_audio and not row.assistant_audio  # recordings are opt-in

    await asyncio.to_thread(_admin_shows, row, reply.text, shown, items)


def _admin_shows(row, reply_text, shown, items):
    browser = admin_browser()
    page = browser.get(f"/admin/pool/session/{row.pk}/change/").content.decode()
    assert "What should I ask my country?" in page and "[interrupted]" in page
    assert "invalid_value: " in page and "First audio sent" in page
    found = browser.get("/admin/pool/session/", {"q": "ask my country"}).content.decode()
    assert row.session_id in found
    assert row.session_id not in browser.get("/admin/pool/session/", {"q": "never said"}).content.decode()
    export = json.loads(browser.get(f"/admin/pool/session/{row.pk}/export/").content)
    assert export["items"] == [shown[i.item_id] for i in items if i.kind != "error"]
    assert [e["error"]["code"] for e in export["errors"]] == ["invalid_value"]
    assert {r["status"] for r in export["responses"]} == {"completed", "cancelled"}
    overview = browser.get("/admin/pool/serverprocess/overview/").content.decode()
    assert "unit 0" in overview and ("idle" in overview or "draining" in overview)


async def test_history_keeps_at_most_HISTORY_MAX_ITEMS_and_counts_the_rest(recorded_pool, connect, settings):
    settings.S2S = {**settings.S2S, "HISTORY_MAX_ITEMS": 3}
    client = await connect()
    session_id = (await client.until("session.created"))["session"]["id"]
    for n in range(5):
        await client.send(user_text(f"note {n}"))
        await client.until("conversation.item.done")
    await client.ws.disconnect()
    await asyncio.sleep(0.2)
    assert recorded_pool.records.flush()
    texts = [i.text async for i in ConversationItem.objects.filter(session_id=session_id)]
    assert texts == ["note 0", "note 1", "note 2"]
    assert (await Session.objects.aget(session_id=session_id)).history_dropped == 2


async def recorded_turn(client, recorded=True):
    """A spoken turn answered, then the client leaves; returns the session's row once its
    recording is stored (``recorded=False``: once its unit has drained, when a recording would
    have been stored)."""
    session_id = (await client.until("session.created"))["session"]["id"]
    for append in appends(np.concatenate([jfk_segment(*QUESTION), silence(1.5)])):
        await client.send(append)
    assert (await client.until("response.done", timeout=30))["response"]["status"] == "completed"
    await client.ws.disconnect()

    def done():
        row = Session.objects.get(session_id=session_id)
        return row if (row.user_audio and row.assistant_audio if recorded else row.drained_at) else None

    return await asyncio.to_thread(wait_until, done, 10, "both recordings stored" if recorded else "drained")


async def test_recordings_are_stored_as_flac_and_heard_only_with_the_permission(
        recorded_pool, connect, settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    settings.S2S = {**settings.S2S, "RECORD_AUDIO": True}
    row = await recorded_turn(await connect())
    user, rate = soundfile.read(row.user_audio.path)
    assert rate == 16_000 and abs(len(user) / rate - row.audio_in_seconds) < 0.05
    assert np.sqrt(np.mean(user[:int(2.2 * rate)] ** 2)) > 0.01  # the speech is in it
    assistant, rate = soundfile.read(row.assistant_audio.path)
    assert rate == 24_000 and abs(len(assistant) / rate - row.audio_out_seconds) < 0.05
    assert row.user_audio.name.endswith(f"{row.session_id}-user.flac")
    await asyncio.to_thread(_recordings_need_the_permission, row)


def _recordings_need_the_permission(row):
    url = f"/admin/pool/session/{row.pk}/recording/user/"
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_session", content_type__app_label="pool"))
    browser = HttpClient()
    assert browser.login(username="viewer", password="pw")
    assert browser.get(url).status_code == 403
    page = browser.get(f"/admin/pool/session/{row.pk}/change/").content.decode()
    assert "<audio" not in page and "needs the" in page
    viewer.user_permissions.add(Permission.objects.get(codename="listen_recording"))
    reply = browser.get(url)
    assert reply.status_code == 200 and reply["Content-Type"] == "audio/flac"
    assert b"".join(reply.streaming_content) == open(row.user_audio.path, "rb").read()
    assert "<audio" in browser.get(f"/admin/pool/session/{row.pk}/change/").content.decode()


async def test_an_api_key_that_says_no_recording_wins_over_RECORD_AUDIO(recorded_pool, settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    settings.S2S = {**settings.S2S, "RECORD_AUDIO": True, "ALLOW_ANONYMOUS": False}
    _, key = await sync_to_async(APIKey.issue)("no recordings", record_audio=False)
    client, _ = await open_socket([(b"authorization", f"Bearer {key}".encode())])
    row = await recorded_turn(client, recorded=False)
    assert not row.user_audio and not row.assistant_audio and row.completed_responses == 1
    assert not list(tmp_path.rglob("*.flac"))


@pytest.mark.django_db
def test_prune_sessions_deletes_old_finished_sessions_with_their_history_and_recordings(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    now = timezone.now()

    def session(name, age_days, ended=True, recorded=False):
        created = now - timedelta(days=age_days)
        row = Session.objects.create(session_id=name, unit_index=0, created_at=created,
                                     ended_at=created + timedelta(minutes=1) if ended else None)
        ConversationItem.objects.create(session=row, item_id=f"item_{name}", kind="message", role="user",
                                        text="hi", at_ms=0, data={})
        SessionResponse.objects.create(session=row, response_id=f"resp_{name}", status="completed", at_ms=1)
        if recorded:
            row.user_audio = default_storage.save(f"s2s-recordings/{name}-user.flac", ContentFile(b"fLaC"))
            row.save()

    session("old", 40, recorded=True)
    session("older", 90)
    session("recent", 5, recorded=True)
    session("recorded_last_week", 10, recorded=True)  # past RECORDING_RETENTION_DAYS (7) only
    session("old_but_open", 40, ended=False)  # a session still going (or lost, not yet marked) is kept
    out = StringIO()
    call_command("prune_sessions", "--dry-run", stdout=out)
    assert "recordings of 2 sessions" in out.getvalue() and "delete 2 sessions" in out.getvalue()
    assert Session.objects.count() == 5 and len(list(tmp_path.rglob("*.flac"))) == 3
    call_command("prune_sessions", "--batch-size", "1", stdout=StringIO())
    assert set(Session.objects.values_list("session_id", flat=True)) == {
        "recent", "recorded_last_week", "old_but_open"}
    assert ConversationItem.objects.count() == SessionResponse.objects.count() == 3
    assert [p.name for p in tmp_path.rglob("*.flac")] == ["recent-user.flac"]
    assert not Session.objects.get(session_id="recorded_last_week").user_audio
    settings.S2S = {"HISTORY_RETENTION_DAYS": 3, "RECORDING_RETENTION_DAYS": None}
    call_command("prune_sessions", stdout=StringIO())
    assert set(Session.objects.values_list("session_id", flat=True)) == {"old_but_open"}
    assert not list(tmp_path.rglob("*.flac"))  # a session's recording goes with it


@pytest.mark.django_db
@pytest.mark.parametrize("rule", ["anonymise", "delete"])
def test_deleting_a_user_takes_the_content_of_their_sessions_with_them(settings, tmp_path, rule):
    settings.MEDIA_ROOT = str(tmp_path)
    settings.S2S = {"HISTORY_ON_USER_DELETE": rule}
    owner, other = User.objects.create_user("owner"), User.objects.create_user("other")

    def session(name, user):
        api_key, _ = APIKey.issue(f"key of {name}", user=user)
        row = Session.objects.create(session_id=name, unit_index=0, created_at=timezone.now(), api_key=api_key,
                                     turns=3, user_audio=default_storage.save(f"{name}.flac", ContentFile(b"fLaC")))
        ConversationItem.objects.create(session=row, item_id=f"item_{name}", kind="message", role="user",
                                        text="my secret", at_ms=0, data={"content": [{"transcript": "my secret"}]})

    session("theirs", owner)
    session("someone_elses", other)
    owner.delete()
    kept = Session.objects.get(session_id="someone_elses")
    assert kept.user_audio and kept.items.get().text == "my secret"
    assert [p.name for p in tmp_path.rglob("*.flac")] == ["someone_elses.flac"]
    if rule == "delete":
        assert not Session.objects.filter(session_id="theirs").exists()
    else:
        row = Session.objects.get(session_id="theirs")
        assert row.turns == 3 and not row.user_audio and row.api_key is None
        assert (row.items.get().text, row.items.get().data) == ("", {})


@pytest.mark.django_db
def test_staff_without_the_view_permission_see_no_session_page_and_no_export():
    row = Session.objects.create(session_id="sess_private", unit_index=0, created_at=timezone.now())
    User.objects.create_user("unit_watcher", password="pw", is_staff=True).user_permissions.add(
        Permission.objects.get(codename="view_unit"))
    browser = HttpClient()
    assert browser.login(username="unit_watcher", password="pw")
    for url in (f"/admin/pool/session/{row.pk}/change/", f"/admin/pool/session/{row.pk}/export/"):
        assert browser.get(url).status_code == 403, url


def test_every_turn_timing_has_its_column_and_the_admin_names_only_real_timings():
    """``TurnTimings`` is the one record of turn latency: each of its fields is a column of
    ``SessionResponse`` of the matching type, and the admin shows only fields it has."""
    from django.db import models

    from pool.admin import TIMING_COLUMNS

    columns = {f.name: f for f in SessionResponse._meta.get_fields()}
    for name in FIELDS:
        kind = models.BooleanField if name == "stt_speculative" else models.FloatField
        assert isinstance(columns.get(name), kind), name
        assert columns[name].null, name  # None: never reached
    assert {f"{name}_ms" for name, _label in TIMING_COLUMNS} <= set(FIELDS)


@pytest.mark.django_db
def test_the_session_page_draws_why_a_reply_stopped_and_the_overview_the_first_audio_of_the_hour():
    """An operator's picture of a session: the user's speech, a backchannel dropped and echo
    removed over the assistant, the reply as sent and where speech over it stopped it (its
    reason), the gap from the end of speech to the reply's first audio; and on the pool overview
    the p50/p95 of the last hour's first audio."""
    now = timezone.now()
    row = Session.objects.create(session_id="sess_drawn", unit_index=0, created_at=now - timedelta(minutes=10))
    item = dict(session=row, role="user", status="completed", data={})
    ConversationItem.objects.create(item_id="item_q", kind="message", text="Tell me a story.", at_ms=1_000,
                                    audio_start_ms=800, audio_end_ms=2_400, **item)
    ConversationItem.objects.create(item_id="item_a", kind="message", role="assistant", status="incomplete",
                                    text="Once upon a time", at_ms=3_600, audio_ms=2_500, interrupted=True,
                                    response_id="resp_1", session=row, data={})
    ConversationItem.objects.create(item_id="overlap_1", kind="overlap", text="Mm-hmm.", at_ms=4_300,
                                    audio_start_ms=3_900, audio_end_ms=4_300, **{**item, "status": "backchannel"})
    heard = [{"voiced_ms": 320, "transcript": "That", "likeness": -0.456},
             {"voiced_ms": 640, "transcript": "So it's my", "likeness": -2.078},
             {"voiced_ms": None, "transcript": "So it's my fight.", "likeness": None}]
    ConversationItem.objects.create(item_id="overlap_3", kind="overlap", text="So it's my fight.", at_ms=5_800,
                                    audio_start_ms=5_600, audio_end_ms=6_500,
                                    **{**item, "status": "interruption", "data": {"heard": heard, "held_ms": 420}})
    ConversationItem.objects.create(item_id="overlap_2", kind="overlap", at_ms=4_500, audio_start_ms=3_700,
                                    audio_end_ms=5_200, **{**item, "status": "echo"})
    ConversationItem.objects.create(item_id="item_w", kind="message", text="Wait, stop.", at_ms=6_000,
                                    audio_start_ms=5_800, audio_end_ms=6_700, **item)
    SessionResponse.objects.create(session=row, response_id="resp_1", status="cancelled", reason="turn_detected",
                                   at_ms=2_900, first_audio_sent_ms=1_200)
    page = admin_browser().get(f"/admin/pool/session/{row.pk}/change/").content.decode()
    start = page.index('<svg class="s2s-timeline"')
    svg = page[start:page.index("</svg>", start)]
    assert svg.count('class="speech"') == 2 and 'class="stopped"' in svg and 'class="reply"' not in svg
    assert "<title>Once upon a time - stopped: turn_detected</title>" in svg
    assert "<title>backchannel: Mm-hmm.</title>" in svg and 'class="echo"' in svg
    # why speech over the assistant was taken for an interruption: each peek, the deciding one last
    assert ("<title>interruption: So it&#x27;s my fight. (&#x27;That&#x27; at 320 ms, likeness -0.46; "
            "&#x27;So it&#x27;s my&#x27; at 640 ms, likeness -2.08; held 420 ms)</title>") in svg
    assert ">1.20 s</text>" in svg  # speech end to first audio

    for n, ms in enumerate([900, 1_100, 1_300, 4_000]):
        SessionResponse.objects.create(session=row, response_id=f"resp_{n + 2}", status="completed",
                                       at_ms=60_000 * n, first_audio_sent_ms=ms)
    overview = admin_browser().get("/admin/pool/serverprocess/overview/").content.decode()
    assert "p50 1.30 s, p95 4.00 s over 4 answered turns" in overview
    assert overview.count("<polyline points=\"") == 2
