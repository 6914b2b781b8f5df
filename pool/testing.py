"""Test support for projects that serve the pool: live ``runpool`` servers and the Redis and
PostgreSQL databases that several of them share (as ``daphne.testing`` serves Daphne's tests).

Each is a context manager that stops what it started; ``contextlib.ExitStack`` starts several
in sequence and stops them in reverse, also when one of them fails to start::

    with ExitStack() as stack:
        url = stack.enter_context(postgres_database())
        a = stack.enter_context(LiveServer(tmp / "a", env={"DATABASE_URL": url}))

Nothing here knows a checkout's paths (a project's tests say where its ``manage.py`` is, or run
from its folder), and nothing here runs in a server.
"""

import glob
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

# The PostgreSQL server on which postgres_database creates its databases (libpq's URL form).
POSTGRES = os.environ.get("S2S_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout, what="the condition", interval=0.1):
    """Call ``predicate()`` every ``interval`` s until it returns something true, and return
    that. Raises AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)
    return result


def port_open(port, host="127.0.0.1"):
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


class LiveServer:
    """``manage.py runpool`` in a subprocess with its own SQLite file (unless ``env`` names a
    ``DATABASE_URL``), ready once /healthz answers. A context manager: SIGTERM at exit."""

    ADMIN = ("admin", "admin-pw")

    def __init__(self, folder, pool_size=1, env=None, args=("--allow-anonymous",), prefix="", migrate=True,
                 project_dir=None, port=None, command_prefix=()):
        """``folder``: where its database, log and media go. ``args``: runpool's options beyond
        port and pool size; by default those of the local quick start (``make serve``).
        ``prefix``: where the host project mounts the apps ("" for s2s_project, "/voice").
        ``migrate=False``: leave a fresh database to runpool. ``project_dir``: the folder of the
        ``manage.py`` to run (default: the current directory). ``command_prefix``: argv that runs the server's command (e.g.
        ``unshare`` with a mount of its own; it must ``exec`` the command, so that signals reach
        it). Raises RuntimeError (with the log's tail) if it does not start."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.prefix = prefix
        self.project_dir = Path(project_dir or Path.cwd())
        self.base_url = f"ws://127.0.0.1:{self.port}{prefix}/v1"
        self.db = folder / "db.sqlite3"
        self.log = folder / "server.log"
        self.media = folder / "media"  # recordings (RECORD_AUDIO)
        # WebRTC offers 127.0.0.1 only: a test's media never leaves the loopback range.
        self.env = {**os.environ, "S2S_SQLITE_PATH": str(self.db), "DJANGO_MEDIA_ROOT": str(self.media),
                    "S2S_WEBRTC_HOST_ADDRESSES": "127.0.0.1", **(env or {})}
        if migrate:
            self.manage("migrate", "--noinput", "-v0")
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [*command_prefix, sys.executable, "manage.py", "runpool", "--port", str(self.port), "--pool-size",
                 str(pool_size), *args], cwd=self.project_dir, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"runpool did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.3)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.stop()

    def _healthy(self):
        try:
            with urllib.request.urlopen(f"{self.http_url}{self.prefix}/healthz", timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    def manage(self, *args, env=None):
        """Run a management command against this server's database; returns its stdout."""
        run = subprocess.run([sys.executable, "manage.py", *args], cwd=self.project_dir,
                             env={**self.env, **(env or {})}, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{run.stderr[-3000:]}")
        return run.stdout

    def create_admin(self):
        """A superuser ``ADMIN`` in this server's database."""
        self.manage("createsuperuser", "--noinput", env={
            "DJANGO_SUPERUSER_USERNAME": self.ADMIN[0], "DJANGO_SUPERUSER_PASSWORD": self.ADMIN[1],
            "DJANGO_SUPERUSER_EMAIL": "admin@example.com"})

    @property
    def http_url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout=30, patience=5):
        """SIGTERM (the process drains), then after ``patience`` s SIGINT (a second signal: it
        stops at once), as an operator presses Ctrl-C twice; returns the exit code. Raises
        RuntimeError if it has not stopped ``timeout`` s after the first signal."""
        self.process.terminate()
        try:
            return self.process.wait(patience)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(max(timeout - patience, 1))
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise RuntimeError(f"runpool did not stop within {timeout} s of SIGTERM and SIGINT") from None

    def query(self, sql):
        """Rows of ``sql`` on its SQLite database."""
        with sqlite3.connect(self.db) as db:
            return db.execute(sql).fetchall()


class RedisServer:
    """A redis-server of its own on a free port (no persistence), to stop and start at will.
    A context manager: stopped at exit."""

    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.start()

    def start(self):
        self.process = subprocess.Popen([shutil.which("redis-server"), "--port", str(self.port), "--bind",
                                         "127.0.0.1", "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        wait_until(lambda: port_open(self.port), 5, "redis-server listening", interval=0.05)

    def stop(self):
        self.process.terminate()
        self.process.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.stop()


class PrivatePostgres:
    """A PostgreSQL cluster of its own (initdb in a new temporary folder, a free port), to stop
    and start at will without touching the machine's (an outage on demand). As root it runs as
    the ``postgres`` user. ``remove()`` stops it and deletes its folder."""

    def __init__(self):
        binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not binaries and not shutil.which("pg_ctl"):
            raise RuntimeError("PostgreSQL's server binaries (pg_ctl, initdb) are needed")
        self.bin = os.path.dirname(binaries[-1]) if binaries else os.path.dirname(shutil.which("pg_ctl"))
        # Not under pytest's tmp_path: the postgres user cannot enter root's 0700 folders.
        self.data, self.port = Path(tempfile.mkdtemp(prefix="s2s-pg-")), free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()

    def _run(self, tool, *args, check=True):
        command = [os.path.join(self.bin, tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=check, capture_output=True, timeout=120)

    def start(self):
        self._run("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.data / "log"), "-o",
                  f"-p {self.port} -h 127.0.0.1 -k {self.data} -c fsync=off", "start")

    def stop(self):
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "fast", "stop")

    def remove(self):
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.data, ignore_errors=True)


def full_filesystem_at(folder, size, used=0):
    """A ``command_prefix`` that runs the server in a mount namespace of its own, where ``folder``
    is a tmpfs of ``size`` bytes with ``used`` bytes taken: a disk as full as that, as the server
    sees it, and nobody else (the mount goes with the process). Needs root."""
    if os.geteuid() != 0:
        raise RuntimeError("a full filesystem of one's own needs root (unshare -m, mount -t tmpfs)")
    script = 'mount -t tmpfs -o size="$1" tmpfs "$0" && head -c "$2" /dev/zero > "$0/filler" && shift 2 && exec "$@"'
    return ("unshare", "-m", "--propagation", "private", "sh", "-c", script, str(folder), str(size), str(used))


def fill(folder):
    """Write into ``folder`` until its filesystem is full (a ``full_filesystem_at`` of a server,
    seen from outside at ``/proc/<pid>/root/<folder>``)."""
    with open(Path(folder) / "filler", "ab", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
        except OSError:
            pass


@contextmanager
def postgres_database(server=POSTGRES):
    """A new, empty database on ``server`` for the duration; yields its URL, then drops it
    (closing what is still connected)."""
    import psycopg

    name = f"s2s_test_{secrets.token_hex(4)}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as db:
            db.execute(f"DROP DATABASE {name} WITH (FORCE)")


def shared_services(stack, **settings):
    """A PostgreSQL database and a Redis of their own for several ``runpool`` processes, entered
    on ``stack`` (a ``contextlib.ExitStack``). Returns ``(env, database URL, RedisServer)``:
    ``env`` is a LiveServer environment on them, with the scripted test backend and ``settings``
    as ``S2S_JSON``."""
    import json

    database = stack.enter_context(postgres_database())
    redis = stack.enter_context(RedisServer())
    env = {"DATABASE_URL": database, "REDIS_URL": redis.url, "S2S_BACKEND": "scripted",
           "S2S_JSON": json.dumps(settings)}
    return env, database, redis


def run_stage(stage, messages, inbox=None, on_forward=None, timeout=5.0, ctx=None):
    """Run a pipeline stage as its unit thread would, for a test of that stage alone (as
    pipecat's ``run_test`` runs a processor). Returns ``(emitted, forwarded)``: the unit events
    it emitted to the session, and the messages it put on the next stage's queue, in order.

    ``stage``: built with ``inbox`` (a ``queue.Queue``) as its next stage's queue, if it has one.
    Each of ``messages`` goes to ``stage.handle(ctx, message)`` on a thread of its own, one after
    another. ``on_forward(message)``, when given, is called for each forwarded message as it
    comes, on the caller's thread: a stand-in next stage (e.g. one that speaks each phrase at
    once with ``job.phrase_spoken()``, or cancels the job). ``ctx``: a
    ``pool.pipeline.messages.SessionContext`` (default: a new one). Raises TimeoutError when a message is
    still being handled after ``timeout`` seconds.
    """
    import queue
    import threading

    from pool.pipeline.messages import SessionContext

    emitted, forwarded = [], []
    ctx = ctx or SessionContext(emitted.append)
    for message in messages:
        worker = threading.Thread(target=stage.handle, args=(ctx, message), daemon=True)
        worker.start()
        deadline = time.monotonic() + timeout
        while worker.is_alive() or (inbox is not None and not inbox.empty()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{type(stage).__name__} still handles {type(message).__name__} after {timeout} s")
            try:
                _ctx, item = inbox.get(timeout=0.01) if inbox is not None else (None, None)
            except queue.Empty:
                continue
            if item is None:
                worker.join(0.01)
                continue
            forwarded.append(item)
            if on_forward is not None:
                on_forward(item)
        worker.join()
    return emitted, forwarded
