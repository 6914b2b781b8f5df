"""WebRTC (``POST /v1/realtime/calls``) with an aiortc client on loopback: the call, its events
on the data channel, the microphone and the reply track, the WebRTC-only events, refusals."""

import asyncio
import base64
import json
import time

import numpy as np
import pytest
from django.test import AsyncClient

from pool.backends.scripted import SCRIPT

from .helpers import JFK, load_audio
from .webrtc_client import WebRTCClient


def poster(headers=None, path="/v1/realtime/calls"):
    client = AsyncClient()

    async def post(sdp):
        response = await client.post(path, data=sdp, content_type="application/sdp", headers=headers or {})
        return response.status_code, response.headers, response.content.decode()

    return post


@pytest.mark.usefixtures("scripted_pool")
async def test_a_voice_turn_over_webrtc_is_answered_on_the_track():
    client = WebRTCClient()
    status, headers, _ = await client.call(poster())
    assert status == 201 and headers["Content-Type"] == "application/sdp"
    assert headers["Location"].startswith("/v1/realtime/calls/rtc_")
    created = await client.until("session.created")
    assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    client.microphone.play(load_audio(JFK))
    await client.until("input_audio_buffer.speech_started", timeout=15)
    await client.until("input_audio_buffer.committed", timeout=20)
    done = await client.until("response.done", timeout=20)
    assert done["response"]["status"] == "completed"
    response_id = done["response"]["id"]
    while (await client.until("output_audio_buffer.stopped", timeout=20))["response_id"] != response_id:
        pass
    playback = [e["type"] for e in client.events if e.get("response_id") == response_id
                and e["type"].startswith("output_audio_buffer.")]
    assert playback == ["output_audio_buffer.started", "output_audio_buffer.stopped"]
    assert "response.output_audio.delta" not in client.types()  # the audio is on the track
    assert client.heard_audio() > 0.2
    await client.hangup()


def user_text_event(text):
    return {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


LONG_REPLY = " ".join(f"This is sentence number {n} of a long scripted story." for n in range(1, 13))


@pytest.mark.usefixtures("scripted_pool")
async def test_output_audio_buffer_clear_stops_the_audio_and_cuts_the_transcript_where_it_stopped():
    SCRIPT.reply = LONG_REPLY
    client = WebRTCClient()
    await client.call(poster())
    await client.until("session.created")
    client.send(user_text_event("Tell me a story."))
    client.send({"type": "response.create"})
    started = await client.until("output_audio_buffer.started")
    await asyncio.sleep(1.0)
    cleared_at = asyncio.get_running_loop().time()
    client.send({"type": "output_audio_buffer.clear"})
    truncated = await client.until("conversation.item.truncated")
    cleared = await client.until("output_audio_buffer.cleared")
    since = time.monotonic() + 0.1  # the server has stopped the track; what was in flight has 100 ms
    assert cleared["response_id"] == started["response_id"]
    waited_ms = (asyncio.get_running_loop().time() - cleared_at) * 1000 + 1000
    assert 800 <= truncated["audio_end_ms"] <= waited_ms + 400  # what had played: about the second waited
    await asyncio.sleep(0.5)
    assert client.heard_audio(since=since) <= 0.02  # then silence
    client.send({"type": "conversation.item.retrieve", "item_id": truncated["item_id"]})
    item = (await client.until("conversation.item.retrieved"))["item"]
    transcript = item["content"][0]["transcript"]
    assert 0 < len(transcript.split()) < len(LONG_REPLY.split()) / 2
    await client.hangup()


@pytest.mark.usefixtures("scripted_pool")
async def test_a_call_while_the_pool_is_full_gets_429_and_claims_nothing(scripted_pool):
    calls = [WebRTCClient() for _ in range(3)]
    statuses = [(await call.call(poster()))[0] for call in calls[:2]]
    status, headers, body = await calls[2].call(poster())
    assert statuses == [201, 201] and status == 429 and headers["Retry-After"]
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == ("session_limit_reached", "rate_limit_error")
    assert [unit["state"] for unit in scripted_pool.snapshot()] == ["active", "active"]
    for call in calls:
        await call.hangup()


@pytest.mark.usefixtures("scripted_pool")
@pytest.mark.parametrize("body, content_type, code", [
    ("v=0\r\nthis is not sdp", "application/sdp", "invalid_sdp"),
    ("", "application/sdp", "invalid_sdp"),
    ("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n", "application/sdp", "invalid_sdp"),
    ('{"sdp": "v=0"}', "application/json", "invalid_request"),
])
async def test_a_malformed_offer_gets_400_with_an_openai_error_and_claims_nothing(scripted_pool, body,
                                                                                    content_type, code):
    response = await AsyncClient().post("/v1/realtime/calls", data=body, content_type=content_type)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]
    assert [unit["state"] for unit in scripted_pool.snapshot()] == ["idle", "idle"]


def vanish(client):
    """Close the client's UDP sockets without a word: to the server, a peer that disappeared."""
    for transceiver in client.pc.getTransceivers():
        connection = transceiver.sender.transport.transport._connection  # aioice's Connection
        for protocol in connection._protocols:
            protocol.transport.close()


@pytest.mark.usefixtures("scripted_pool")
async def test_a_client_that_disappears_frees_its_unit_when_ice_consent_expires(scripted_pool, monkeypatch):
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.2)  # RFC 7675's 5 s, shortened for the test
    client = WebRTCClient()
    await client.call(poster())
    await client.until("session.created")
    vanish(client)
    from .test_pool_lifecycle import wait_for

    await wait_for(lambda: [u["state"] for u in scripted_pool.snapshot()] == ["idle", "idle"], timeout=15)
    await client.hangup()


@pytest.mark.usefixtures("scripted_pool")
async def test_the_hangup_endpoint_ends_the_call(scripted_pool):
    client = WebRTCClient()
    _, headers, _ = await client.call(poster())
    await client.until("session.created")
    assert (await AsyncClient().post(headers["Location"] + "/hangup", headers={"Authorization": "Bearer x"})
            ).status_code == 404  # not the credentials that opened it
    assert (await AsyncClient().post(headers["Location"] + "/hangup")).status_code == 200
    from .test_pool_lifecycle import wait_for

    await wait_for(lambda: [u["state"] for u in scripted_pool.snapshot()] == ["idle", "idle"])
    await client.hangup()


@pytest.mark.usefixtures("scripted_pool")
async def test_the_session_form_field_configures_the_session_and_a_bad_one_is_400():
    client = WebRTCClient()
    http = AsyncClient()

    async def post_form(sdp, session):
        response = await http.post("/v1/realtime/calls", data={"sdp": sdp, "session": json.dumps(session)})
        return response.status_code, response.headers, response.content.decode()

    status, _, body = await client.call(lambda sdp: post_form(sdp, {"instructions": 42}))
    assert status == 400 and json.loads(body)["error"]["param"] == "session.instructions"
    client = WebRTCClient()
    status, _, _ = await client.call(lambda sdp: post_form(sdp, {"type": "realtime", "instructions": "Be brief."}))
    assert status == 201
    assert (await client.until("session.created"))["session"]["instructions"] == "Be brief."
    await client.hangup()


@pytest.mark.usefixtures("scripted_pool")
async def test_a_bad_event_on_the_data_channel_is_an_error_and_the_session_goes_on():
    client = WebRTCClient()
    await client.call(poster())
    await client.until("session.created")
    client.channel.send("{not json")
    assert (await client.until("error"))["error"]["code"] == "invalid_json"
    client.send({"type": "session.update", "session": {"voice": 3}})
    assert (await client.until("error"))["error"]["code"] in ("invalid_type", "unknown_parameter")
    client.send({"type": "session.update", "session": {"instructions": "Still here."}})
    assert (await client.until("session.updated"))["session"]["instructions"] == "Still here."
    await client.hangup()


async def test_keys_and_client_secrets_as_for_the_websocket_and_the_row_says_webrtc(keyed_pool):
    from django.utils import timezone

    from pool.models import Session

    from .test_access_control import issue
    from .test_pool_lifecycle import wait_for

    api_key, key = await issue()
    status, _, body = await WebRTCClient().call(poster())
    assert status == 401 and json.loads(body)["error"]["code"] == "missing_api_key"

    secret = await AsyncClient().post("/v1/realtime/client_secrets", data={}, content_type="application/json",
                                      headers={"Authorization": f"Bearer {key}"})
    client = WebRTCClient()
    status, _, _ = await client.call(poster({"Authorization": f"Bearer {secret.json()['value']}"}))
    assert status == 201
    await client.until("session.created")
    await client.hangup()
    await wait_for(lambda: Session.objects.filter(ended_at__isnull=False).exists())
    row = await Session.objects.aget()
    assert (row.transport, row.api_key_id, row.end_reason) == ("webrtc", api_key.id, "client_close")

    api_key.revoked_at = timezone.now()
    await api_key.asave()
    status, _, body = await WebRTCClient().call(poster({"Authorization": f"Bearer {key}"}))
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"


async def test_microphone_audio_a_wedged_unit_cannot_take_is_dropped_not_held():
    from aiortc import RTCPeerConnection

    from realtime.webrtc.call import MAX_QUEUED_FRAMES, WebRTCCall

    pc = RTCPeerConnection()
    call = WebRTCCall("rtc_test", pc)  # no session reads its inbox: as a unit that takes nothing
    for _ in range(MAX_QUEUED_FRAMES + 100):
        call._append(bytes(960))
    assert (call._inbox.qsize(), call.dropped_frames) == (MAX_QUEUED_FRAMES, 100)
    await pc.close()


async def test_the_reply_track_says_each_reply_started_and_stopped_even_back_to_back():
    from realtime.webrtc.media import FRAME_SAMPLES, ReplyTrack

    said = []
    track = ReplyTrack(lambda kind, response_id: said.append((kind, response_id)))
    tone = (np.ones(FRAME_SAMPLES * 3, np.int16) * 1000).tobytes()  # 60 ms
    track.push(tone, "resp_a", "item_a")
    track.finish("resp_a")
    track.push(tone, "resp_b", "item_b")  # queued before resp_a has played
    frames = [await track.recv() for _ in range(8)]
    track.finish("resp_b")
    assert said == [("started", "resp_a"), ("stopped", "resp_a"), ("started", "resp_b"), ("stopped", "resp_b")]
    assert track.played_ms == {"item_a": 60.0, "item_b": 60.0}
    assert [abs(frame.to_ndarray()).max() > 0 for frame in frames] == [True] * 6 + [False] * 2
    track.stop()


async def test_a_reply_cancelled_before_it_played_is_never_heard():
    from realtime.webrtc.media import FRAME_SAMPLES, ReplyTrack

    said = []
    track = ReplyTrack(lambda kind, response_id: said.append((kind, response_id)))
    tone = (np.ones(FRAME_SAMPLES * 2, np.int16) * 1000).tobytes()  # 40 ms
    track.push(tone, "resp_a", "item_a")
    track.finish("resp_a")
    track.push(tone, "resp_b", "item_b")  # queued behind resp_a, then cancelled
    assert track.drop("resp_b") == ["item_b"]
    frames = [await track.recv() for _ in range(4)]
    assert said == [("started", "resp_a"), ("stopped", "resp_a")]
    assert [abs(frame.to_ndarray()).max() > 0 for frame in frames] == [True, True, False, False]
    track.stop()


class _Channel:
    readyState = "open"  # noqa: N815 - RTCDataChannel's attribute

    def __init__(self):
        self.sent = []

    def send(self, text):
        self.sent.append(json.loads(text))


async def test_a_reply_cancelled_while_the_track_waits_for_its_next_phrase_is_cleared_not_stopped():
    """On a CPU where the TTS is slower than real time the track plays all it holds of a reply
    and waits for its next phrase; speech over it then cancels the reply. It did not play to its
    end: ``cleared`` (and the item cut where it stopped), as when audio was still queued."""
    from aiortc import RTCPeerConnection

    from realtime.webrtc.call import WebRTCCall
    from realtime.webrtc.media import FRAME_SAMPLES

    pc = RTCPeerConnection()
    call = WebRTCCall("rtc_test", pc)
    call.channel = _Channel()
    truncates = []
    call.live = type("Live", (), {})()
    call.live.session = type("Session", (), {
        "config": {"audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": True}}}},
        "items": {"item_a"}, "handle_client_event": staticmethod(truncates.append)})()
    tone = (np.ones(FRAME_SAMPLES * 3, np.int16) * 1000).tobytes()  # 60 ms: the first phrase
    call.send_event({"type": "response.output_audio.delta", "response_id": "resp_a", "item_id": "item_a",
                     "delta": base64.b64encode(tone).decode()})
    for _ in range(4):
        await call.reply.recv()  # played, and the track waits for more
    call.send_event({"type": "input_audio_buffer.speech_started", "item_id": "item_u"})
    call.send_event({"type": "response.done", "response": {"id": "resp_a", "status": "cancelled"}})
    await asyncio.sleep(0)
    playback = [(e["type"], e["response_id"]) for e in call.channel.sent if e["type"].startswith("output_audio_buffer.")]
    assert playback == [("output_audio_buffer.started", "resp_a"), ("output_audio_buffer.cleared", "resp_a")]
    assert [(t["item_id"], t["audio_end_ms"]) for t in truncates] == [("item_a", 60)]
    call.reply.stop()
    await pc.close()
