"""What the proxy adds to first audio: the same recordings over the WebSocket, straight to a
``runpool`` with the real default models and through Debian's Caddy running the shipped
``deploy/Caddyfile`` (``tests/proxy.py``), alternating, in one run.

    python -m bench.proxy [--runs 2]

Both upstreams of the Caddyfile (``a`` and ``b``) are the one server; the proxied client uses
the ``/a`` prefix, as a client secret's ``connect_url`` does. Milliseconds from the end of the
user's speech to the first ``response.output_audio.delta`` received (``bench.driver.turns``).
"""

import argparse
import asyncio
import tempfile
import time

from tests.proxy import Caddy

from .common import RECORDINGS, emit, start_server, stats
from .driver import converse, turns

SESSION = {"type": "realtime"}


def run(server, proxy, recordings, runs):
    """First audio straight to ``server`` and through ``proxy``, each recording ``runs`` times."""
    direct, proxied = [], []
    for _ in range(runs):
        for path in recordings.values():
            for rows, url in ((direct, f"{server.base_url}/realtime"), (proxied, f"{proxy.ws_url}/a/v1/realtime")):
                rows += [turn["first_audio"] for turn in turns(asyncio.run(converse(url, path, SESSION)))]
                time.sleep(2)
    return {"runs": runs, "first_audio_ms": {"direct": stats(direct), "through_caddy": stats(proxied)}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with start_server() as server:
        upstream = f"127.0.0.1:{server.port}"
        with Caddy(tempfile.mkdtemp(prefix="s2s-bench-caddy-"), {"a:8000": upstream, "b:8000": upstream}) as proxy:
            emit("proxy", run(server, proxy, RECORDINGS, args.runs))


if __name__ == "__main__":
    main()
