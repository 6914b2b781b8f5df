"""Memory per unit: resident memory of the server with a pool of 1 and of N, models loaded and
warmed by one spoken turn. Models are shared, so each extra unit should cost little.

    python -m bench.memory [--units 8]
"""

import argparse
import asyncio

from .common import RECORDINGS, emit, rss_mb, start_server
from .driver import converse


def resident_after_a_turn(pool_size):
    server = start_server(pool_size)
    try:
        asyncio.run(converse(f"{server.base_url}/realtime", RECORDINGS["hotwords"]))
        return round(rss_mb(server.process.pid), 1)
    finally:
        server.stop()


def measure(units):
    one, many = resident_after_a_turn(1), resident_after_a_turn(units)
    per_unit = round((many - one) / (units - 1), 1)
    return {"rss_mb_pool_1": one, f"rss_mb_pool_{units}": many, "mb_per_extra_unit": per_unit,
            "target_under_50mb_per_unit": per_unit < 50}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=8)
    args = parser.parse_args(argv)
    emit("memory_per_unit", measure(args.units))


if __name__ == "__main__":
    main()
