"""Throughput under load: every unit of a pool in conversation at once, each client saying the
same recording at the same moment, so that every reply is asked for at once. First audio from the
end of speech (p50/p95, and p50 as a multiple of the single conversation's in the same run), and
playback stalls: the silence a listener hears mid-reply, playing the audio in real time.

    python -m bench.throughput [--pools 1,2,4,8] [--rounds 2] [--stagger 0]
                               [--compare | --compare-background | --compare-side-by-side] [--project-dir CHECKOUT]

``--compare`` runs each pool twice in one run: with ``COMPUTE_RUNS_AT_ONCE`` = 3 x the pool size
(every unit's Whisper, llama.cpp and Kokoro runs at once, the cores shared by the OS: the
behaviour before the deadline-first queue) and with the default (one run at a time, earliest
deadline first). ``--compare-background`` runs each pool without the compute queue's background
lane (``COMPUTE_BACKGROUND`` off: work due later and speculative work wait in the one lane) and
with it (the default); ``--compare-side-by-side`` with one synthesis at a time
(``COMPUTE_SIDE_BY_SIDE`` off) and with later phrases two at once (the default). Each pool's row
counts the model calls by how they ran (``compute_calls``: alone, batch, side_by_side,
background; from the server's ``/metrics``). ``--stagger S`` starts client i of a pool S x i seconds after the first:
people who do not all stop speaking at the same moment, so that a turn ends while other replies
are being spoken (and their later phrases synthesized). ``--project-dir`` serves another checkout
(a "before" of a change, run alternately with the change in one session).
"""

import argparse
import asyncio
import collections
import json

from .common import RECORDINGS, TOKEN, counters, emit, start_server, stats
from .driver import converse, turns

SESSION = {"audio": {"input": {"turn_detection": {"interrupt_response": False}}}}
STALL_MS = 300  # a gap a listener notices (the target: none longer in any reply)


def outcomes(conversation):
    """How each response of a conversation ended: its ``response.done`` status (with the reason
    of a cancelled or incomplete one), or "unfinished" (no ``response.done`` by the client's
    deadline), the cancelled ones included, which the first-audio figures leave out."""
    ended, created = collections.Counter(), set()
    for _, event in conversation["events"]:
        if event["type"] == "response.created":
            created.add(event["response"]["id"])
        elif event["type"] == "response.done":
            created.discard(event["response"]["id"])
            response = event["response"]
            reason = ((response.get("status_details") or {}).get("reason"))
            ended[response["status"] + (f": {reason}" if reason and response["status"] != "completed" else "")] += 1
    ended["unfinished"] += len(created)
    return ended


async def everyone(server, pool, rounds, stagger=0.0):
    """Each round, every client says the same recording, client i ``stagger`` x i seconds after
    the first (0: at the same moment)."""
    names = ["hotwords", "stereo"]
    rows, replies = [], collections.Counter()

    async def client(i, recording):
        await asyncio.sleep(i * stagger)
        return await converse(f"{server.base_url}/realtime", recording, SESSION)

    for r in range(rounds):
        conversations = await asyncio.gather(*(client(i, RECORDINGS[names[r % 2]]) for i in range(pool)))
        rows += [row for conversation in conversations for row in turns(conversation, unfinished=True)]
        for conversation in conversations:
            replies += outcomes(conversation)
    return rows, replies


def run(server, pool, rounds, stagger=0.0):
    rows, replies = asyncio.run(everyone(server, pool, rounds, stagger))
    stalls = [r["playback_stall"] for r in rows]
    return {"pool_size": pool, "turns": len(rows), "replies": dict(replies), "first_audio_ms": stats([r["first_audio"] for r in rows]),
            "transcript_ms": stats([r["transcript"] for r in rows]), "playback_stall_ms": stats(stalls),
            f"replies_with_stall_over_{STALL_MS}_ms": sum(s > STALL_MS for s in stalls),
            "compute_calls": counters(server, "s2s_compute_calls_total", "how")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pools", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compare", action="store_true",
                        help="each pool also with every model run at once (before the queue)")
    parser.add_argument("--stagger", type=float, default=0.0,
                        help="seconds between the clients' starts (0: all at the same moment)")
    parser.add_argument("--compare-background", action="store_true",
                        help="each pool also without the background lane (COMPUTE_BACKGROUND off)")
    parser.add_argument("--compare-side-by-side", action="store_true",
                        help="each pool also with one synthesis at a time (COMPUTE_SIDE_BY_SIDE off)")
    parser.add_argument("--settings", type=json.loads, default={},
                        help="more S2S settings for every configuration, JSON (e.g. '{\"SPECULATIVE_REPLIES\": false}')")
    parser.add_argument("--project-dir", default=None, help="serve another checkout (a \"before\" of a change)")
    args = parser.parse_args(argv)
    pools = [int(p) for p in args.pools.split(",")]
    configurations = {"deadline_first": lambda pool: {}}
    if args.compare:
        configurations = {"all_at_once": lambda pool: {"COMPUTE_RUNS_AT_ONCE": 3 * pool}, **configurations}
    if args.compare_background:
        configurations = {"one_lane": lambda pool: {"COMPUTE_BACKGROUND": False}, **configurations}
    if args.compare_side_by_side:
        configurations = {"one_at_a_time": lambda pool: {"COMPUTE_SIDE_BY_SIDE": False}, **configurations}
    results = {}
    for name, settings in configurations.items():
        rows = []
        for pool in pools:
            server = start_server(pool, {"STATUS_TOKEN": TOKEN, **args.settings, **settings(pool)},
                                  project_dir=args.project_dir)
            try:
                rows.append(run(server, pool, args.rounds, args.stagger))
            finally:
                server.stop()
        single = next((row["first_audio_ms"]["p50"] for row in rows if row["pool_size"] == 1 and row["turns"]), None)
        for row in rows:
            if single and row["first_audio_ms"]:
                row["first_audio_p50_vs_single"] = round(row["first_audio_ms"]["p50"] / single, 2)
        results[name] = rows
    emit("throughput_under_load", {"silence_ms": 500, "stagger_s": args.stagger, "settings": args.settings,
                                   "project_dir": args.project_dir,
                                   "configurations": results})


if __name__ == "__main__":
    main()
