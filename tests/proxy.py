"""Debian's Caddy as a plain process, running the shipped ``deploy/Caddyfile``: the routes, the
load-balancing policy and the health check are the file's; only what a test machine cannot have
is replaced, and nothing else is added to the site: HTTP on a loopback port instead of TLS for
``$S2S_HOST``, and loopback ports instead of the Compose service names ``a:8000`` and
``b:8000``. Caddy's own admin endpoint is switched off (two proxies must not share its port).
"""

import re
import shutil
import subprocess
import time
from pathlib import Path

from pool.testing import free_port, port_open

from .helpers import PROJECT_DIR

CADDYFILE = PROJECT_DIR / "deploy" / "Caddyfile"


def caddy_path():
    path = shutil.which("caddy")
    if path is None:
        raise RuntimeError("Caddy is missing: install Debian's package with `apt-get install caddy` "
                           "(make test does this when run as root).")
    return path


def caddyfile_for_test(upstreams, port):
    """The text of ``deploy/Caddyfile`` for a test: ``upstreams`` maps the file's upstream
    addresses (``a:8000``) to loopback ones (``127.0.0.1:PORT``); the site listens on
    ``http://127.0.0.1:port``."""
    text = CADDYFILE.read_text()
    assert "{$S2S_HOST} {" in text, "deploy/Caddyfile no longer serves {$S2S_HOST}"
    text = text.replace("{$S2S_HOST} {", f"http://127.0.0.1:{port} {{", 1)
    for name, address in upstreams.items():
        text, found = re.subn(rf"(?<=\s){re.escape(name)}(?=\s)", address, text)
        assert found, f"deploy/Caddyfile names no upstream {name}"
    return "{\n\tadmin off\n}\n\n" + text


class Caddy:
    """``with Caddy(folder, {"a:8000": "127.0.0.1:8001", ...}) as proxy``: the proxy on
    ``proxy.port`` (``port``, or a free one; ``proxy.http_url``, ``proxy.ws_url``) until the
    block ends. Its upstreams may start later: Caddy's health checks find them."""

    def __init__(self, folder, upstreams, port=None):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.http_url, self.ws_url = f"http://127.0.0.1:{self.port}", f"ws://127.0.0.1:{self.port}"
        self.config = folder / "Caddyfile"
        self.config.write_text(caddyfile_for_test(upstreams, self.port))
        self.log = folder / "caddy.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([caddy_path(), "run", "--config", str(self.config), "--adapter",
                                             "caddyfile"], stdout=log, stderr=log,
                                            env={"HOME": str(folder), "XDG_DATA_HOME": str(folder / "data"),
                                                 "XDG_CONFIG_HOME": str(folder / "config"), "PATH": "/usr/bin:/bin"})
        deadline = time.monotonic() + 20
        while not port_open(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"caddy did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
