"""The browser page in headless Chromium with a fake microphone playing a real recording, against
the live server with the real models, over the WebSocket (the page's fallback; WebRTC, its
default, is tried in a network namespace of its own by tests/test_webrtc_browser.py: Chromium's
candidates would name the machine's other interfaces here)."""

import numpy as np
import pytest
import soundfile

from pool.testing import LiveServer
from realtime.client import load_audio

from .browser import admin_login, browser, screenshot_path
from .helpers import JFK

pytestmark = pytest.mark.chromium


def test_a_person_talks_to_the_agent_in_the_browser(server, tmp_path):
    wav = tmp_path / "jfk.wav"  # Chromium's fake capture takes a PCM WAV file
    speech = np.concatenate([np.zeros(24_000, np.float32), load_audio(JFK, 48_000)])
    soundfile.write(wav, speech, 48_000, subtype="PCM_16")
    flags = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             f"--use-file-for-fake-audio-capture={wav}%noloop", "--autoplay-policy=no-user-gesture-required"]
    with browser(flags) as chromium:
        context = chromium.new_context(viewport={"width": 1100, "height": 900})
        context.grant_permissions(["microphone"], origin=server.http_url)
        page = context.new_page()
        page.goto(server.http_url + "/")
        page.wait_for_function("document.getElementById('pool').textContent.includes('units free')")
        page.select_option("#transport", "websocket")  # WebRTC: tests/test_webrtc_browser.py
        page.click("#connect")
        page.wait_for_function("window.s2s.stats.appends > 10", timeout=30_000)
        page.wait_for_function("window.s2s.stats.audioDeltas > 0", timeout=180_000)
        page.screenshot(path=str(screenshot_path("talk-mid-conversation.png")), full_page=True)

        admin = context.new_page()
        admin_login(admin, server, "/admin/pool/unit/")
        units = admin.inner_text("#result_list")
        admin.screenshot(path=str(screenshot_path("admin-pool-during-browser-session.png")), full_page=True)
        assert "active" in units

        page.wait_for_function("window.s2s.stats.completed > 0", timeout=180_000)
        stats = page.evaluate("window.s2s.stats")
        user = page.locator(".turn.user span").all_inner_texts()
        agent = page.locator(".turn.agent span").all_inner_texts()
        page.screenshot(path=str(screenshot_path("talk-after-reply.png")), full_page=True)
        page.click("#disconnect")
    assert stats["userTranscripts"] >= 1 and any(text.strip() for text in user)
    assert any(text.strip() for text in agent)
    assert stats["scheduledSamples"] >= 12_000  # at least 0.5 s of reply audio played at 24 kHz
    assert stats["appends"] > 100  # the microphone streamed for seconds


def test_a_full_pool_is_a_clear_message_in_the_page(scripted_server):
    import asyncio
    import threading

    import websockets

    holders_ready, release = threading.Event(), threading.Event()

    async def hold_both():
        url = f"{scripted_server.base_url}/realtime"
        async with websockets.connect(url) as a, websockets.connect(url) as b:
            await a.recv(), await b.recv()
            holders_ready.set()
            await asyncio.to_thread(release.wait, 60)

    holder = threading.Thread(target=lambda: asyncio.run(hold_both()))
    holder.start()
    try:
        assert holders_ready.wait(30)
        flags = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
        with browser(flags) as chromium:
            context = chromium.new_context()
            context.grant_permissions(["microphone"], origin=scripted_server.http_url)
            page = context.new_page()
            page.goto(scripted_server.http_url + "/")
            page.select_option("#transport", "websocket")  # WebRTC: tests/test_webrtc_browser.py
            page.click("#connect")
            page.wait_for_function("document.getElementById('status').dataset.kind === 'error'", timeout=15_000)
            message = page.inner_text("#status")
            page.screenshot(path=str(screenshot_path("talk-pool-full.png")))
        assert "busy" in message
    finally:
        release.set()
        holder.join(30)


@pytest.mark.live
def test_on_a_server_that_needs_keys_a_logged_in_user_talks_through_a_client_secret(tmp_path):
    """The page asks its site for a client secret (POST /client_secret, the user's login and
    CSRF token) and connects with it; the browser never sees an API key. A visitor who is not
    logged in is told to log in."""
    flags = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
    with LiveServer(tmp_path, env={"S2S_BACKEND": "scripted"}, args=()) as live, browser(flags) as chromium:
        live.create_admin()
        visitor = chromium.new_context()
        visitor.grant_permissions(["microphone"], origin=live.http_url)
        page = visitor.new_page()
        page.goto(live.http_url + "/")
        page.select_option("#transport", "websocket")  # WebRTC: tests/test_webrtc_browser.py
        page.click("#connect")
        page.wait_for_function("document.getElementById('status').dataset.kind === 'error'", timeout=15_000)
        assert "Log in" in page.inner_text("#status")

        member = chromium.new_context()
        member.grant_permissions(["microphone"], origin=live.http_url)
        page = member.new_page()
        admin_login(page, live, "/admin/")
        page.goto(live.http_url + "/")
        page.fill("#instructions", "Answer like a lighthouse keeper.")
        page.select_option("#transport", "websocket")  # WebRTC: tests/test_webrtc_browser.py
        page.click("#connect")
        page.wait_for_function("window.s2s.stats.appends > 10", timeout=30_000)
        stats = page.evaluate("window.s2s.stats")
        page.click("#disconnect")
        rows = live.query("SELECT s.used_at IS NOT NULL, u.username, s.session FROM pool_clientsecret s "
                          "JOIN auth_user u ON u.id = s.user_id")
    assert stats["clientSecrets"] == 1
    assert [(used, user) for used, user, _ in rows] == [(1, "admin")]
    assert "lighthouse keeper" in rows[0][2]


@pytest.mark.live
def test_where_webrtc_cannot_connect_the_page_falls_back_to_the_websocket_and_says_so(scripted_server):
    """An endpoint that answers the offer with a proxy's 404 page: the page talks over the
    WebSocket and says why. (No media is exchanged: the offer is never answered.)"""
    flags = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             "--disable-features=WebRtcHideLocalIpsWithMdns"]
    with browser(flags) as chromium:
        context = chromium.new_context()
        context.grant_permissions(["microphone"], origin=scripted_server.http_url)
        page = context.new_page()
        page.route("**/v1/realtime/calls", lambda route: route.fulfill(status=404, content_type="text/html",
                                                                      body="<h1>Not Found</h1>"))
        page.goto(scripted_server.http_url + "/")
        page.click("#connect")
        page.wait_for_function("window.s2s.stats.appends > 10", timeout=30_000)
        shown = page.inner_text("#transport-name")
        transport = page.evaluate("window.s2s.transport")
        page.click("#disconnect")
    assert transport == "websocket" and shown == "WebSocket (WebRTC could not connect: HTTP 404)"
