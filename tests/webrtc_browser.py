"""A stock ``@openai/agents`` browser app, and the server's own page, against a live server over
WebRTC, in headless Chromium: ``python -m tests.webrtc_browser OUT.json`` writes what happened. Run it in a network namespace
of its own (``unshare -n``, by ``tests/test_webrtc_browser.py``): Chromium offers host
candidates on every interface it has, and a namespace with only the loopback interface is the
way to keep every packet of the call on loopback.

The app is ``RealtimeSession`` with its default transport (WebRTC in a browser) and nothing
changed but its URL, given a client secret as a browser app gets one from its backend. Its
fake microphone plays jfk.flac, a pause, then jfk.flac again over the reply. The page is
instrumented only from outside the app: an init script taps each remote track into an
AnalyserNode (the reply's loudness, every 50 ms). Then the server's page (``/``) connects with
its default transport, in a second tab, and answers the same recording.
"""

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import soundfile

from pool.testing import LiveServer
from realtime.client import load_audio

from .browser import browser
from .helpers import JFK, PROJECT_DIR

NODE_DIR = PROJECT_DIR / "tests" / "node"
INSTRUCTIONS = "Tell a long story of at least ten sentences about the sea, whatever the user says."

TAP_TRACKS = """
window.energy = [];
const Native = window.RTCPeerConnection;
window.RTCPeerConnection = function (...args) {
  const pc = new Native(...args);
  pc.addEventListener('track', (event) => {
    const context = new AudioContext();
    const analyser = context.createAnalyser();
    context.createMediaStreamSource(event.streams[0] || new MediaStream([event.track])).connect(analyser);
    const samples = new Float32Array(analyser.fftSize);
    setInterval(() => {
      analyser.getFloatTimeDomainData(samples);
      const rms = Math.sqrt(samples.reduce((sum, x) => sum + x * x, 0) / samples.length);
      window.energy.push([performance.now(), rms]);
    }, 50);
  });
  return pc;
};
window.RTCPeerConnection.prototype = Native.prototype;
"""

APP = """
async ({secret, url, instructions}) => {
  const { RealtimeAgent, RealtimeSession } = window.agents;
  const agent = new RealtimeAgent({ name: 'Storyteller', instructions });
  const session = new RealtimeSession(agent);
  window.log = [];
  session.on('transport_event', (event) => window.log.push([performance.now(), event]));
  await session.connect({ apiKey: secret, url });
  window.transportName = session.transport.constructor.name;
}
"""


def bundle(folder):
    """The browser build of @openai/agents' realtime API (esbuild, from tests/node)."""
    out = folder / "agents-browser.js"
    subprocess.run([str(NODE_DIR / "node_modules" / ".bin" / "esbuild"), str(NODE_DIR / "browser-agents.mjs"),
                    "--bundle", "--format=iife", "--global-name=agents", "--platform=browser",
                    f"--outfile={out}", "--log-level=warning"], check=True)
    return out.read_text()


def microphone(folder):
    """The fake microphone's WAV (48 kHz PCM16): jfk.flac, 8 s of silence (the reply starts
    playing 1.5-5 s after the end of speech, by the CPU: Kokoro runs at 0.3-1.3x real time on the
    machines measured), jfk.flac again over the reply, then silence."""
    speech = load_audio(JFK, 48_000)
    path = folder / "microphone.wav"
    soundfile.write(path, np.concatenate([speech, np.zeros(8 * 48_000, np.float32), speech,
                                          np.zeros(30 * 48_000, np.float32)]), 48_000, subtype="PCM_16")
    return path


def client_secret(live):
    """A client secret, as an app's backend gets one for its browser page."""
    request = urllib.request.Request(f"{live.http_url}/v1/realtime/client_secrets", method="POST",
                                     data=json.dumps({"session": {"type": "realtime"}}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply)["value"]


def demo_page(context, origin):
    """The server's page with its default transport, until its first reply has played."""
    page = context.new_page()
    page.add_init_script(TAP_TRACKS)
    page.goto(f"{origin}/")
    page.click("#connect")
    page.wait_for_function("window.s2s.transport === 'webrtc'", timeout=30_000)
    page.wait_for_function("window.s2s.stats.completed > 0 && window.s2s.stats.playbackStarted > 0", timeout=120_000)
    time.sleep(3)  # some of the reply plays
    result = page.evaluate("({stats: window.s2s.stats, events: window.s2s.events, energy: window.energy, "
                           "shown: document.getElementById('transport-name').textContent})")
    page.click("#disconnect")
    return result


def run(out, seconds=75):
    folder = Path(tempfile.mkdtemp(prefix="webrtc-browser-"))
    script = bundle(folder)
    wav = microphone(folder)
    with LiveServer(folder / "server", pool_size=2) as live:
        origin = live.http_url
        flags = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                 f"--use-file-for-fake-audio-capture={wav}%noloop", "--autoplay-policy=no-user-gesture-required",
                 "--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns"]
        with browser(flags) as chromium:
            context = chromium.new_context()
            context.grant_permissions(["microphone"], origin=origin)
            page = context.new_page()
            page.add_init_script(TAP_TRACKS)
            # The app's page, served from the server's origin (as a site serves its own app).
            page.route(f"{origin}/app/", lambda route: route.fulfill(
                content_type="text/html", body="<!doctype html><title>app</title><script src='agents.js'></script>"))
            page.route(f"{origin}/app/agents.js", lambda route: route.fulfill(
                content_type="text/javascript", body=script))
            page.goto(f"{origin}/app/")
            page.evaluate(APP, {"secret": client_secret(live), "url": f"{origin}/v1/realtime/calls",
                                "instructions": INSTRUCTIONS})
            time.sleep(seconds)
            result = page.evaluate("({log: window.log, energy: window.energy, transport: window.transportName})")
            result["page"] = demo_page(context, origin)
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    run(sys.argv[1])
