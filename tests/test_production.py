"""Safe to run in production: client addresses only from trusted proxies, a connect rate per
address, a session length limit, settings checked, a secret key that is never a constant, a
production settings profile that passes ``check --deploy``, runpool on a fresh database.
(Anonymous access is in ``test_access_control``.)"""

import json
import os
import stat
import subprocess
import sys

import pytest
from django.core.management.utils import get_random_secret_key

from pool.access import accounting, auth
from pool.models import Session
from pool.testing import LiveServer

from .helpers import PROJECT_DIR as ROOT
from .helpers import open_socket, refused_with


def scope(peer, headers=()):
    return {"client": (peer, 50000), "headers": [(k, v.encode()) for k, v in headers]}


def test_forwarded_addresses_are_believed_only_from_trusted_proxies(settings):
    settings.S2S = {"TRUSTED_PROXIES": ["127.0.0.1", "10.0.0.0/8"]}
    spoofed = [(b"x-forwarded-for", "203.0.113.9")]
    assert auth.client_address(scope("198.51.100.4", spoofed)) == "198.51.100.4"
    assert auth.client_address(scope("127.0.0.1", spoofed)) == "203.0.113.9"
    # Read right to left past trusted hops: what the client wrote itself is on the left.
    chain = [(b"x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.1.2.3")]
    assert auth.client_address(scope("127.0.0.1", chain)) == "203.0.113.9"
    two_headers = [(b"x-forwarded-for", "6.6.6.6"), (b"x-forwarded-for", "203.0.113.9")]
    assert auth.client_address(scope("127.0.0.1", two_headers)) == "203.0.113.9"
    assert auth.client_address(scope("127.0.0.1")) == "127.0.0.1"
    # A Forwarded header the client sent is passed on by nginx: with X-Forwarded-For (the
    # default PROXY_ADDRESS_HEADER) it is ignored.
    both = [(b"forwarded", "for=9.9.9.9"), (b"x-forwarded-for", "203.0.113.50")]
    assert auth.client_address(scope("127.0.0.1", both)) == "203.0.113.50"
    # Not an address: the proxy's own, never the text (it would be recorded and rate-limited).
    for junk in ("unknown", "_hidden", "<script>", "a" * 200, "192.0.2.8:5678"):
        assert auth.client_address(scope("127.0.0.1", [(b"x-forwarded-for", junk)])) == "127.0.0.1"
    # IPv4 peers of a server bound to "::" arrive IPv4-mapped; addresses come out normalised.
    assert auth.client_address(scope("::ffff:127.0.0.1", spoofed)) == "203.0.113.9"
    v6 = [(b"x-forwarded-for", "2001:DB8:0:0::1")]
    assert auth.client_address(scope("127.0.0.1", v6)) == "2001:db8::1"
    settings.S2S = {}
    assert auth.client_address(scope("127.0.0.1", spoofed)) == "127.0.0.1"


def test_the_forwarded_header_is_read_when_the_proxy_writes_it(settings):
    settings.S2S = {"TRUSTED_PROXIES": ["10.0.0.0/8"], "PROXY_ADDRESS_HEADER": "Forwarded"}
    forwarded = [(b"forwarded", 'for=6.6.6.6, for="[2001:db8::7]:4711";proto=https'),
                 (b"x-forwarded-for", "9.9.9.9")]
    assert auth.client_address(scope("10.0.0.2", forwarded)) == "2001:db8::7"
    assert auth.client_address(scope("10.0.0.2", [(b"forwarded", "for=192.0.2.1:80")])) == "192.0.2.1"
    for junk in ('for=unknown', 'for=_hidden', 'for="[2001:db8::1'):
        assert auth.client_address(scope("10.0.0.2", [(b"forwarded", junk)])) == "10.0.0.2"


def test_the_default_connect_rate_allows_60_a_minute_per_address():
    rate = accounting.ConnectRate()
    assert all(rate.allow("192.0.2.1", now=t * 0.5) for t in range(60))
    assert not rate.allow("192.0.2.1", now=30.0)
    assert rate.allow("192.0.2.2", now=30.0)
    assert rate.allow("192.0.2.1", now=60.1)  # the first connect left the window
    rate.allow("192.0.2.3", now=200.0)  # sweeps addresses silent for a minute
    assert set(rate._times) == {"192.0.2.3"}
    # One IPv6 client rotating through its /64 is one client.
    assert all(rate.allow(f"2001:db8::{i:x}", now=300.0) for i in range(60))
    assert not rate.allow("2001:db8::ffff", now=300.0) and rate.allow("2001:db8:0:1::1", now=300.0)


async def test_connects_over_the_rate_are_refused_per_client_address(scripted_pool, settings):
    settings.S2S = {**settings.S2S, "CONNECTS_PER_MINUTE": 2, "TRUSTED_PROXIES": ["127.0.0.1"]}
    proxy = {"client": ("127.0.0.1", 40000)}

    async def served(**where):
        client, _ = await open_socket(**where)
        created = (await client.recv())["type"] == "session.created"
        await client.ws.disconnect()
        return created

    assert await served(client=("198.51.100.1", 1))
    assert await served(headers=[(b"x-forwarded-for", b"198.51.100.1")], **proxy)
    client, _ = await open_socket(client=("198.51.100.1", 1))
    assert await refused_with(client) == "rate_limit_exceeded"
    client, _ = await open_socket(headers=[(b"x-forwarded-for", b"198.51.100.1")], **proxy)
    assert await refused_with(client) == "rate_limit_exceeded"
    assert await served(client=("198.51.100.2", 1))
    assert await served(headers=[(b"x-forwarded-for", b"198.51.100.3")], **proxy)


async def test_refused_connects_do_not_use_up_an_address_budget(scripted_pool, settings):
    """Clients without a key behind the same address (a NAT, a proxy) cannot lock out the ones
    with a key: only sessions count."""
    from asgiref.sync import sync_to_async

    from pool.models import APIKey

    settings.S2S = {**settings.S2S, "CONNECTS_PER_MINUTE": 2, "ALLOW_ANONYMOUS": False}
    _, key = await sync_to_async(APIKey.issue)("budget")
    where = {"client": ("198.51.100.9", 1)}
    for _ in range(5):
        client, _ = await open_socket(**where)
        assert await refused_with(client) == "missing_api_key"
    for _ in range(2):
        client, _ = await open_socket([(b"authorization", f"Bearer {key}".encode())], **where)
        assert (await client.recv())["type"] == "session.created"
        await client.ws.disconnect()
    client, _ = await open_socket([(b"authorization", f"Bearer {key}".encode())], **where)
    assert await refused_with(client) == "rate_limit_exceeded"


async def test_the_session_row_records_the_address_a_trusted_proxy_names(recorded_pool, settings):
    settings.S2S = {**settings.S2S, "TRUSTED_PROXIES": ["127.0.0.1"]}
    client, _ = await open_socket([(b"x-forwarded-for", b"203.0.113.50")], client=("127.0.0.1", 1))
    session_id = (await client.recv())["session"]["id"]
    await client.ws.disconnect()
    assert recorded_pool.records.flush()
    assert (await Session.objects.aget(session_id=session_id)).client_address == "203.0.113.50"


async def test_a_session_past_its_maximum_length_ends_with_an_error_and_a_normal_close(
        recorded_pool, connect, settings):
    settings.S2S = {**settings.S2S, "MAX_SESSION_SECONDS": 0.5}
    client = await connect()
    session_id = (await client.until("session.created"))["session"]["id"]
    for _ in range(3):  # a talking client is closed too: this is not the idle timeout
        await client.send({"type": "input_audio_buffer.clear"})
        await client.until("input_audio_buffer.cleared")
    error = await client.until("error", timeout=3)
    assert error["error"]["code"] == "session_expired"
    assert await client.ws.receive_output(2) == {"type": "websocket.close", "code": 1000}
    await client.ws.disconnect()
    assert recorded_pool.records.flush()
    row = await Session.objects.aget(session_id=session_id)
    assert (row.end_reason, row.close_code) == ("session_expired", 1000)


def test_settings_checks_name_unknown_keys_wrong_types_and_the_old_loopback_rule(settings):
    from pool.checks import check_settings

    settings.S2S = {"ALLOW_ANONYMOUS": "loopback", "POOL_SIZ": 2, "POOL_SIZE": True,
                    "TRUSTED_PROXIES": ["10.0.0.0/8", "proxy.local"], "CONNECTS_PER_MINUTE": None,
                    "RELEASE_AFTER_SECONDS": 5, "STT_MODEL": ROOT, "THREADS": {"llm": 1, "tts": "two"}}
    problems = check_settings(None)
    assert sorted(p.id for p in problems) == ["pool.E005"] * 3 + ["pool.E006", "pool.W003"]
    assert any("['THREADS']['tts'] = 'two'" in p.msg for p in problems)
    by_key = {p.msg.split("]")[0]: p for p in problems if p.id == "pool.E005"}
    assert "proxy" in by_key["S2S['ALLOW_ANONYMOUS'"].hint
    assert "must be int" in by_key["S2S['POOL_SIZE'"].msg
    assert next(p for p in problems if p.id == "pool.W003").hint == "Did you mean 'POOL_SIZE'?"
    assert "proxy.local" in next(p for p in problems if p.id == "pool.E006").msg


@pytest.mark.parametrize("variant, refused", [("auto", False), ("fp32", False), ("int8", False), ("int8-gemm", False),
                                              ("fp16", True)])
def test_the_tts_variant_is_auto_or_a_prepared_variant(settings, variant, refused):
    from pool.checks import check_settings

    settings.S2S = {"TTS_VARIANT": variant}
    problems = check_settings(None)
    assert [p.msg for p in problems] == (["S2S['TTS_VARIANT'] must be one of 'auto', 'int8', 'fp32', 'int8-gemm'; "
                                          "got 'fp16'."]
                                         if refused else [])


@pytest.mark.parametrize("floor, refused", [(None, False), (0, False), (10, False), (5, True), ("10", True)])
def test_the_peek_window_floor_is_none_0_or_10(settings, floor, refused):
    from pool.checks import check_settings

    settings.S2S = {"PEEK_WINDOW_FLOOR_S": floor}
    messages = [p.msg for p in check_settings(None)]
    assert bool(messages) is refused and all("PEEK_WINDOW_FLOOR_S" in m for m in messages), messages


@pytest.mark.parametrize("mode, refused", [("auto", False), ("native", False), ("prompt", False), ("json", True)])
def test_llm_tool_calls_is_auto_native_or_prompt(settings, mode, refused):
    from pool.checks import check_settings

    settings.S2S = {"LLM_TOOL_CALLS": mode}
    problems = check_settings(None)
    assert [p.msg for p in problems] == (["S2S['LLM_TOOL_CALLS'] must be 'auto', 'native' or 'prompt'; got 'json'."]
                                         if refused else [])


def test_a_backend_is_a_short_name_or_the_dotted_path_of_a_loader(settings):
    from pool.backends import InvalidBackendError, backend_loader, load_default
    from pool.backends.scripted import load_scripted
    from pool.checks import check_settings
    from pool.conf import get_config
    from pool.process import build_registry

    assert backend_loader("default") is load_default and backend_loader("scripted") is load_scripted
    settings.S2S = {"BACKEND": "pool.backends.scripted.load_scripted", "POOL_SIZE": 1}
    assert check_settings(None) == []
    registry = build_registry(get_config(), record=False)  # a host project's loader, by its path
    try:
        assert registry.speaks["transcription_languages"] == ["de", "en"]  # the scripted STT's
    finally:
        registry.shutdown()
    settings.S2S = {"BACKEND": "myproject.voices.load"}
    [problem] = check_settings(None)
    assert problem.id == "pool.E007" and "myproject.voices.load" in problem.msg
    with pytest.raises(InvalidBackendError, match="cannot import 'myproject.voices.load'"):
        backend_loader("myproject.voices.load")


def test_the_projects_own_settings_pass_the_checks():
    from pool.checks import check_settings

    assert check_settings(None) == []


def _python(code, env):
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={k: v for k, v in {**os.environ, **env}.items() if v is not None})
    return run


SECRET_KEY = "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"


def test_without_a_configured_secret_key_each_machine_makes_and_keeps_a_random_one(tmp_path):
    env = {"DJANGO_SETTINGS_MODULE": "s2s_project.settings", "DJANGO_SECRET_KEY": None,
           "DJANGO_SECRET_KEY_FILE": None, "XDG_CONFIG_HOME": str(tmp_path / "a")}
    first = _python(SECRET_KEY, env).stdout.strip()
    path = tmp_path / "a" / "s2s-realtime" / "secret_key"
    assert len(first) >= 50 and path.read_text() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _python(SECRET_KEY, env).stdout.strip() == first
    other = _python(SECRET_KEY, {**env, "XDG_CONFIG_HOME": str(tmp_path / "b")}).stdout.strip()
    assert len(other) >= 50 and other != first


def test_processes_starting_together_agree_on_one_key_and_an_empty_file_is_refused(tmp_path):
    code = ("import os, sys; sys.path.insert(0, os.getcwd()); from s2s_project.settings import SECRET_KEY; "
            "print(SECRET_KEY)")
    for trial in range(5):
        env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / str(trial))}
        env.pop("DJANGO_SECRET_KEY", None)
        starts = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for _ in range(4)]
        keys = {p.communicate(timeout=60)[0].strip() for p in starts}
        assert len(keys) == 1 and len(keys.pop()) >= 50
    empty = tmp_path / "empty_key"
    empty.write_text("")
    run = _python(SECRET_KEY, {"DJANGO_SETTINGS_MODULE": "s2s_project.settings", "DJANGO_SECRET_KEY": None,
                               "DJANGO_SECRET_KEY_FILE": str(empty)})
    assert run.returncode != 0 and f"The secret key in {empty} is too short" in run.stderr


def test_the_production_profile_passes_check_deploy_and_requires_a_key(tmp_path):
    env = {"DJANGO_SETTINGS_MODULE": "s2s_project.settings_production",
           "DJANGO_SECRET_KEY": get_random_secret_key(), "DJANGO_ALLOWED_HOSTS": "voice.example.com",
           "S2S_SQLITE_PATH": str(tmp_path / "db.sqlite3")}
    check = [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"]
    run = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env})
    assert run.returncode == 0, run.stderr
    env.pop("DJANGO_SECRET_KEY")
    run = subprocess.run(check, cwd=ROOT, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"} | env)
    assert run.returncode != 0 and "DJANGO_SECRET_KEY must be set" in run.stderr


@pytest.mark.live
def test_runpool_migrates_a_fresh_sqlite_database_and_serves(tmp_path):
    live = LiveServer(tmp_path, env={"S2S_BACKEND": "scripted"}, migrate=False)
    try:
        assert live.query("select count(*) from pool_unit") == [(1,)]
    finally:
        assert live.stop() == 0


def test_runpool_told_not_to_migrate_says_so_in_one_line(tmp_path):
    env = {**os.environ, "S2S_BACKEND": "scripted", "S2S_SQLITE_PATH": str(tmp_path / "db.sqlite3")}
    run = subprocess.run([sys.executable, "manage.py", "runpool", "--no-migrate", "--port", "1"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "CommandError: The database has unapplied migrations: run `manage.py migrate` "
        "(or `runpool --migrate`) first.")


@pytest.fixture(autouse=True)
def _fresh_connect_rate(monkeypatch):
    monkeypatch.setattr(accounting, "CONNECT_RATE", accounting.ConnectRate())


@pytest.mark.parametrize("blas, refused", [(None, False), (2, False), ("auto", False), (0, True), ("fast", True)])
def test_the_blas_thread_count_is_a_count_or_none(settings, blas, refused):
    from pool.checks import check_settings

    settings.S2S = {"THREADS": {"blas": blas}}
    assert bool(check_settings(None)) == refused


@pytest.mark.parametrize("blas, expected", [(1, 1), (None, 2), ("auto", 2)])
def test_loading_the_backends_holds_numpys_blas_to_its_thread_count(blas, expected):
    """OpenBLAS's idle helper threads spin after each call: on 2 cores one took a quarter of a
    core from 64 listening sessions (BENCHMARKS.md, 3c). Loading the backends holds the process's
    BLAS to THREADS["blas"] when it is a count and leaves it alone with None; "auto" (the
    default) is the default backend's to time (test_model_cache), and leaves a backend without
    Whisper alone. In a process of its own: the limit is process-wide."""
    script = (
        "import json, os, django\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 's2s_project.settings'\n"
        "os.environ['S2S_BACKEND'] = 'scripted'\n"
        "django.setup()\n"
        "from threadpoolctl import threadpool_info\n"
        "from pool.backends import load_backends\n"
        "from pool.conf import get_config\n"
        "blas = lambda: [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
        "before = blas()\n"
        "load_backends(get_config())\n"
        "print(json.dumps([before, blas()]))\n")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2",  # as on any machine of 2 cores or more
           "S2S_JSON": json.dumps({"THREADS": {"blas": blas}})}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before and all(n == 2 for n in before)
    assert after == [expected] * len(before)
