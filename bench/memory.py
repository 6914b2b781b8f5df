"""Memory per unit: resident memory of the server with a pool of 1 and of N, models loaded and
warmed by one spoken turn. Models are shared, so each extra unit should cost little.

    python -m bench.memory [--units 8] [--settings '{"COMPUTE_BACKGROUND": false}']
"""

import argparse
import asyncio
import json

from .common import RECORDINGS, emit, rss_mb, start_server
from .driver import converse


def resident_after_a_turn(pool_size, settings=None):
    server = start_server(pool_size, settings)
    try:
        asyncio.run(converse(f"{server.base_url}/realtime", RECORDINGS["hotwords"]))
        return round(rss_mb(server.process.pid), 1)
    finally:
        server.stop()


def measure(units, settings=None):
    one, many = resident_after_a_turn(1, settings), resident_after_a_turn(units, settings)
    per_unit = round((many - one) / (units - 1), 1)
    return {"rss_mb_pool_1": one, f"rss_mb_pool_{units}": many, "mb_per_extra_unit": per_unit,
            "target_under_50mb_per_unit": per_unit < 50}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--settings", type=json.loads, default={}, help="more S2S settings, JSON")
    args = parser.parse_args(argv)
    emit("memory_per_unit", {"settings": args.settings, **measure(args.units, args.settings)})


if __name__ == "__main__":
    main()
