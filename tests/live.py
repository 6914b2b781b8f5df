"""Live servers for end-to-end tests and benchmarks: ``manage.py runpool`` in a subprocess."""

import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """``manage.py runpool`` in a subprocess with its own SQLite file, ready once /healthz answers."""

    def __init__(self, folder, pool_size=1, env=None, args=("--allow-anonymous",), prefix="", migrate=True):
        """``args``: runpool's options beyond port and pool size; by default those of the local
        quick start (``make serve``). ``prefix``: where the host project mounts the apps
        ("" for s2s_project, "/voice"). ``migrate=False``: leave a fresh database to runpool."""
        self.port = free_port()
        self.prefix = prefix
        self.base_url = f"ws://127.0.0.1:{self.port}{prefix}/v1"
        self.db = folder / "db.sqlite3"
        self.log = folder / "server.log"
        self.media = folder / "media"  # recordings (RECORD_AUDIO)
        env = {**os.environ, "S2S_SQLITE_PATH": str(self.db), "DJANGO_MEDIA_ROOT": str(self.media), **(env or {})}
        self.env = env
        if migrate:
            self.manage("migrate", "--noinput", "-v0")
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "runpool", "--port", str(self.port), "--pool-size",
                 str(pool_size), *args], cwd=ROOT, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"runpool did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.3)

    def _healthy(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.prefix}/healthz", timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    def manage(self, *args, env=None):
        """Run a management command against this server's database; returns its stdout."""
        run = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**self.env, **(env or {})},
                             capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{run.stderr[-3000:]}")
        return run.stdout

    ADMIN = ("admin", "admin-pw")

    def create_admin(self):
        """A superuser ``ADMIN`` in this server's database."""
        self.manage("createsuperuser", "--noinput", env={
            "DJANGO_SUPERUSER_USERNAME": self.ADMIN[0], "DJANGO_SUPERUSER_PASSWORD": self.ADMIN[1],
            "DJANGO_SUPERUSER_EMAIL": "admin@example.com"})

    @property
    def http_url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout=30):
        """SIGTERM; returns the exit code. Fails the test if the server does not stop in time."""
        self.process.terminate()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise RuntimeError(f"runpool did not stop on SIGTERM within {timeout} s") from None

    def query(self, sql):
        with sqlite3.connect(self.db) as db:
            return db.execute(sql).fetchall()


