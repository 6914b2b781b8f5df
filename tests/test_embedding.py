"""The apps embedded in a separate host project, and the package as a wheel."""

import asyncio
import subprocess
import sys
import urllib.request
import zipfile

import pytest

from pool.testing import LiveServer, wait_until
from realtime.client import talk

from .helpers import HOTWORDS, PROJECT_DIR, normalise

ROOT = PROJECT_DIR


@pytest.mark.live
async def test_a_voice_turn_through_a_host_project_under_a_prefix(tmp_path):
    host = LiveServer(tmp_path, env={"DJANGO_SETTINGS_MODULE": "tests.hostproject.settings"}, prefix="/voice")
    def get(path):
        with urllib.request.urlopen(f"{host.http_url}{path}", timeout=5) as reply:
            return reply.read().decode()

    try:
        assert "host site's own home page" in await asyncio.to_thread(get, "/")
        assert 'data-endpoint="/voice/v1/realtime"' in await asyncio.to_thread(get, "/voice/")
        assert await asyncio.to_thread(get, "/backoffice/login/")  # 200, or urlopen raises
        result = await talk(host.base_url, HOTWORDS, timeout_s=180)
        assert result.status == "completed" and "folder" in normalise(result.user_transcript)
        assert len(result.audio) > 0
        # the client's close reaches the server before we stop it
        await asyncio.to_thread(wait_until, lambda: '"idle": 1' in get("/voice/healthz"), 5, "an idle pool")
    finally:
        assert host.stop() == 0
    sessions = host.query("select count(*) from pool_session where end_reason = 'client_close'")
    assert sessions == [(1,)]


def test_system_checks_tell_a_host_what_it_misconfigured(settings):
    from django.core.checks import run_checks

    settings.ASGI_APPLICATION = None
    settings.CHANNEL_LAYERS = {}
    ids = {message.id for message in run_checks()}
    assert {"pool.E002", "pool.W002"} <= ids


@pytest.mark.wheel
def test_the_wheel_carries_templates_static_files_migrations_and_voices(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), "-q"], check=True, cwd=tmp_path)
    wheel = next(tmp_path.glob("django_s2s_realtime-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("realtime/templates/realtime/talk.html", "realtime/static/realtime/talk.js",
                   "realtime/static/realtime/pcm-worklet.js", "pool/migrations/0001_initial.py",
                   "pool/data/voices/af_heart.bin", "pool/data/voices/NOTICE", "realtime/routing.py",
                   "pool/management/commands/runpool.py"):
        assert needed in names, needed
    assert not any(name.startswith("tests/") for name in names)
