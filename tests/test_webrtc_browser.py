"""A stock ``@openai/agents`` browser app, default transport (WebRTC), and the server's own page,
in headless Chromium with a fake microphone, against a live server with the real models: ``tests/webrtc_browser.py`` runs it
in a network namespace of its own (only loopback), and this test reads what happened."""

import json
import subprocess
import sys

import pytest

from .helpers import JFK_WORDS, PROJECT_DIR, normalise

pytestmark = [pytest.mark.chromium, pytest.mark.node, pytest.mark.models, pytest.mark.live]


@pytest.fixture(scope="module")
def call(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser") / "call.json"
    subprocess.run(["unshare", "-n", "sh", "-c", f'ip link set lo up && exec "{sys.executable}" -m '
                    f'tests.webrtc_browser "{out}"'], cwd=PROJECT_DIR, check=True, timeout=600)
    result = json.loads(out.read_text())
    result["events"] = [(at, event) for at, event in result["log"]]
    return result


def loudest(energy, start, end):
    return max((rms for at, rms in energy if start <= at < end), default=0.0)


def test_the_default_transport_is_webrtc_and_the_question_is_heard_and_answered(call):
    assert call["transport"] == "OpenAIRealtimeWebRTC"
    transcripts = [e["transcript"] for _, e in call["events"]
                   if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert any("what your country can do for you" in normalise(t) for t in transcripts), transcripts
    assert JFK_WORDS.split()[0] in normalise(" ".join(transcripts))
    started = next(at for at, e in call["events"] if e["type"] == "output_audio_buffer.started")
    assert loudest(call["energy"], started, started + 3000) > 0.02  # the reply is heard on the remote track


def test_talking_over_the_story_stops_it(call):
    events = call["events"]
    first_reply = next(e["response_id"] for _, e in events if e["type"] == "output_audio_buffer.started")
    cleared_at = next(at for at, e in events
                      if e["type"] == "output_audio_buffer.cleared" and e["response_id"] == first_reply)
    spoke_at = max(at for at, e in events if e["type"] == "input_audio_buffer.speech_started" and at <= cleared_at)
    assert cleared_at - spoke_at < 100  # cleared as the interruption was announced
    truncated = next(e for at, e in events if e["type"] == "conversation.item.truncated" and at >= spoke_at)
    assert truncated["audio_end_ms"] > 1000
    next_start = min((at for at, e in events if e["type"] == "output_audio_buffer.started" and at > cleared_at),
                     default=cleared_at + 5000)
    # Silence on the track from 300 ms after the clear (the browser's jitter buffer) until the
    # next reply plays.
    assert loudest(call["energy"], cleared_at + 300, next_start) < 0.005


def test_the_servers_page_talks_over_webrtc_by_default_and_says_so(call):
    page = call["page"]
    assert page["shown"] == "WebRTC"
    assert page["stats"]["userTranscripts"] >= 1 and page["stats"]["completed"] >= 1
    assert page["stats"]["appends"] == 0 and page["stats"]["audioDeltas"] == 0  # the audio went on the tracks
    started = page["events"].index("output_audio_buffer.started")
    assert started >= 0 and max(rms for _, rms in page["energy"]) > 0.02  # the reply heard on the track
