"""Profile one spoken turn with py-spy: where the server's threads spend their time.

    python -m bench.profile_turn [--recording hotwords] [--out artifacts/turn-profile.txt]

Samples every busy thread of the server (idle waits left out) for the duration of one turn, then
prints the busiest threads and the Python functions they were in (time inside a C extension -
onnxruntime, CTranslate2, torch - counts for the Python function that called it).
"""

import argparse
import asyncio
import collections
import subprocess
import sys
from pathlib import Path

from .common import RECORDINGS, emit, start_server
from .driver import converse


def summarise(raw_path, top=12):
    by_thread, by_function = collections.Counter(), collections.Counter()
    for line in Path(raw_path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread = frames[0]
        leaf = frames[-1].split(" (")[0]
        by_thread[thread] += int(count)
        by_function[leaf] += int(count)
    total = sum(by_thread.values()) or 1
    return {"samples": total,
            "threads": [(name, round(100 * n / total, 1)) for name, n in by_thread.most_common(top)],
            "functions": [(name, round(100 * n / total, 1)) for name, n in by_function.most_common(top)]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recording", default="hotwords")
    parser.add_argument("--out", default="artifacts/turn-profile.txt")
    args = parser.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    server = start_server(1)
    try:
        spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid",
                                str(server.process.pid), "--rate", "200", "--threads",
                                "--format", "raw", "--output", args.out, "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        asyncio.run(converse(f"{server.base_url}/realtime", RECORDINGS[args.recording]))
        spy.send_signal(2)
        spy.wait(30)
    finally:
        server.stop()
    emit("profile_turn", {"recording": args.recording, "raw": args.out, **summarise(args.out)})


if __name__ == "__main__":
    main()
