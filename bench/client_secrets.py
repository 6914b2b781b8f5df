"""Time to issue a client secret: two runpool processes (scripted backend) on one PostgreSQL and
one Redis, ``POST /v1/realtime/client_secrets`` alternately at each.

Three rounds of ``--requests`` each: granted (the cluster has a free unit for every request), full
(every unit reserved: each answer is a 429), and ``--concurrency`` requests at a time on a
cluster with free units. Times are milliseconds from request to answer, as a client sees them.

    python -m bench.client_secrets [--requests 200] [--units 100] [--concurrency 10]
"""

import argparse
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import psycopg

from pool.testing import LiveServer, free_port, shared_services

from .common import emit, stats


def issue(server, key):
    """(HTTP status, milliseconds) of one request."""
    request = urllib.request.Request(f"{server.http_url}/v1/realtime/client_secrets", data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            status = reply.status
            reply.read()
    except urllib.error.HTTPError as error:
        status = error.code
    return status, (time.perf_counter() - started) * 1000


def round_of(servers, key, requests, concurrency):
    def one(i):
        return issue(servers[i % 2], key)

    with ThreadPoolExecutor(concurrency) as threads:
        results = list(threads.map(one, range(requests)))
    return {"statuses": {str(s): sum(1 for r in results if r[0] == s) for s in sorted({r[0] for r in results})},
            "ms": stats([ms for _, ms in results])}


def free_everything(database):
    with psycopg.connect(database, autocommit=True) as db:
        db.execute("UPDATE pool_clientsecret SET expires_at = now() WHERE used_at IS NULL")
        db.execute("UPDATE pool_unit SET reserved_until = NULL")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--units", type=int, default=100, help="units per process")
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    with ExitStack() as stack:
        env, database, _redis = shared_services(stack, CONNECTS_PER_MINUTE=None)
        ports = [free_port(), free_port()]
        servers = [stack.enter_context(LiveServer(Path(tempfile.mkdtemp(prefix="s2s-bench-")), pool_size=args.units,
                                                  env=env, port=port, args=("--public-url", f"ws://127.0.0.1:{port}")))
                   for port in ports]
        key = servers[0].manage("apikey", "create", "bench").strip()
        issue(servers[0], key), issue(servers[1], key)  # warm-up: connections, imports
        free_everything(database)
        granted = round_of(servers, key, args.requests, 1)
        full = round_of(servers, key, args.requests, 1)  # every unit is reserved now
        free_everything(database)
        concurrent = round_of(servers, key, args.requests, args.concurrency)
    emit("client_secrets", {"processes": 2, "units_per_process": args.units, "requests": args.requests,
                            "granted_one_at_a_time": granted, "full_cluster_one_at_a_time": full,
                            f"concurrency_{args.concurrency}": concurrent})


if __name__ == "__main__":
    main()
