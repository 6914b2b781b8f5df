"""Interruptions a person trusts: false and missed interruptions over a playing reply, measured on
the corpus of ``bench.interruption_corpus``.

    python -m bench.interruptions [--split held_out|tune|all] [--reply real|cached] [--parallel N]
                                  [--languages en] [--kinds backchannel,echo] [--limit N]
                                  [--settings JSON] [--rows FILE] [--project-dir CHECKOUT]

Each case is one session of a live server, driven as a client on laptop speakers would: it asks
for a long story (a text item and ``response.create``), plays the reply's audio in real time as
it arrives (and stops it at ``input_audio_buffer.speech_started``, as the SDKs' clients do,
sending ``conversation.item.truncate``), and streams its microphone in real time from the start:
the case's noise, the echo of what it plays (echo cases), and, once it has played 1.0 s of the
reply, the case's utterance. Then 2.5 s more.

- **false interruption**: a case that should leave the reply playing (a backchannel, a non-speech
  sound, an echo) got ``speech_started``, a cancelled reply or a committed turn; and any case
  whose reply was stopped before its utterance began (by its noise or its echo);
- **missed interruption**: a real interruption that neither got ``speech_started`` nor cancelled
  the reply within 1.0 s of its start; **time to cancel**: from the utterance's start to the
  first of the two (a client stops its playback at either).

``--reply real`` (the default) answers with the real default models, one case at a time: the
peeks compete with the story's LLM and TTS for the cores, as in production. ``--reply cached``
replaces the LLM with a fixed story and the TTS with a disk cache of Kokoro's audio of it (the VAD,
the STT and turn-taking are the real ones, and the reply's audio is still Kokoro's), so cases can
run ``--parallel`` for quick tuning; its times to cancel are optimistic.
"""

import argparse
import asyncio
import base64
import collections
import hashlib
import json
import pickle
import re
import statistics
import time
from pathlib import Path

import numpy as np
import websockets

from realtime.audio import float_to_pcm16

from .common import emit, start_server
from .interruption_corpus import RATE, Renderer, cases, corpus_folder, room

CHUNK_MS = 20
CHUNK = RATE * CHUNK_MS // 1000
PLAYED_BEFORE_S = 1.0  # the utterance starts once the client has played this much of the reply
AFTER_S = 2.5  # how long the case goes on after the utterance (or, for echo alone, its 4 s)
ECHO_ALONE_S = 4.0
CANCEL_WITHIN_S = 1.0
POOL_FULL_RETRIES = 60  # a case that finds the pool full tries again every 0.5 s, this often
INSTRUCTIONS = "You are a storyteller. Tell a long story of at least ten sentences, whatever the user says."
ASK = "Tell me a long story about a lighthouse keeper and a storm."


class Playback:
    """The client's speaker: reply audio played in real time from its first delta, in 20 ms
    ticks; an underrun plays silence and waits. ``stop()`` drops what is queued."""

    def __init__(self):
        self.queue = collections.deque()
        self.queued = 0
        self.played_s = 0.0
        self._history = np.zeros(120 * RATE, np.float32)  # what the speaker played, tick by tick
        self._ticks = 0
        self.started = False
        self.stopped = False

    def push(self, samples):
        if not self.stopped:
            self.queue.append(samples)
            self.queued += len(samples)
            self.started = True

    def stop(self):
        self.stopped = True
        self.queue.clear()
        self.queued = 0

    def tick(self):
        """The next 20 ms the speaker plays (float32 @ 24 kHz)."""
        out = np.zeros(CHUNK, np.float32)
        filled = 0
        while filled < CHUNK and self.queue:
            head = self.queue[0]
            take = min(CHUNK - filled, len(head))
            out[filled:filled + take] = head[:take]
            filled += take
            if take == len(head):
                self.queue.popleft()
            else:
                self.queue[0] = head[take:]
        self.queued -= filled
        self.played_s += filled / RATE
        start = self._ticks * CHUNK
        self._history[start:start + CHUNK] = out[: max(0, len(self._history) - start)]
        self._ticks += 1
        return out

    @property
    def history(self):
        """Everything the speaker has played (float32 @ 24 kHz, one sample per microphone sample)."""
        return self._history[: min(self._ticks * CHUNK, len(self._history))]


class Microphone:
    """What the client's microphone hears, 20 ms at a time: the case's noise from the start, the
    echo of the speaker (echo cases), and the utterance once ``begin`` is called."""

    def __init__(self, case, renderer):
        self.case = case
        self.utterance = renderer.utterance(case)
        self.noise = renderer.noise(case, int(60 * RATE))
        self.renderer = renderer
        self.position = 0  # samples sent so far
        self.utterance_at = None  # sample position where the utterance starts
        self.ir = room(case.echo[2], case.seed()) if case.echo else None

    def begin(self):
        self.utterance_at = self.position

    @property
    def utterance_end(self):
        return None if self.utterance_at is None else self.utterance_at + len(self.utterance)

    def chunk(self, played_history):
        """The next 20 ms of microphone signal, float32 @ 24 kHz."""
        start, end = self.position, self.position + CHUNK
        out = self.noise[start % len(self.noise):][:CHUNK].copy()
        if len(out) < CHUNK:
            out = np.concatenate([out, self.noise[: CHUNK - len(out)]])
        if self.case.echo is not None:
            delay_ms, gain_db, _ = self.case.echo
            delay = int(delay_ms * RATE / 1000)
            span = len(self.ir) + CHUNK
            source = np.zeros(span, np.float32)  # the played signal over [end - delay - span, end - delay)
            played = played_history[max(0, end - delay - span): max(0, end - delay)]
            if len(played):
                source[span - len(played):] = played
            out += np.convolve(source, self.ir, "valid")[-CHUNK:] * 10 ** (gain_db / 20)
        if self.utterance_at is not None:
            offset = start - self.utterance_at
            part = self.utterance[max(0, offset): max(0, offset + CHUNK)]
            out[:len(part)] += part
        self.position = end
        return out


class WebSocketConnection:
    """A connection as ``run_case`` uses it, over ``websockets``: ``send(dict)``, ``recv() -> dict``."""

    def __init__(self, ws, first=None):
        self.ws = ws
        self._first = first  # an event already received, given back by the first recv()

    async def send(self, event):
        await self.ws.send(json.dumps(event))

    async def recv(self):
        if self._first is not None:
            event, self._first = self._first, None
            return event
        return json.loads(await self.ws.recv())


async def run_case(connection, case, renderer, session_extra=None):
    """Play one case on a new session (``connection``: ``send(event dict)`` and ``recv() ->
    event dict``, before its ``session.created``); returns its row (what happened, when)."""
    playback, mic = Playback(), Microphone(case, renderer)
    events = []  # (seconds since the utterance's start, or None before it, event type, details)
    state = {"utterance_t": None, "done": False, "story": None, "story_done": None}
    state["session"] = (await connection.recv())["session"]["id"]  # session.created
    session = {"type": "realtime", "instructions": INSTRUCTIONS}
    if case.language != "en":
        session["audio"] = {"input": {"transcription": {"language": case.language}}}
    session.update(session_extra or {})
    await connection.send({"type": "session.update", "session": session})
    await connection.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}})
    await connection.send({"type": "response.create"})
    t0 = time.perf_counter()

    async def microphone():
        tick = 0
        while not state["done"]:
            tick += 1
            await asyncio.sleep(max(0.0, t0 + tick * CHUNK_MS / 1000 - time.perf_counter()))
            playback.tick()
            if mic.utterance_at is None and (playback.played_s >= PLAYED_BEFORE_S or (
                    case.kind == "echo" and playback.played_s > 0)):
                mic.begin()
                state["utterance_t"] = time.perf_counter()
            audio = float_to_pcm16(mic.chunk(playback.history))
            await connection.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})
            if mic.utterance_at is not None:
                length = ECHO_ALONE_S * RATE if case.kind == "echo" else len(mic.utterance)
                if mic.position >= mic.utterance_at + length + AFTER_S * RATE:
                    state["done"] = True
            if time.perf_counter() - t0 > 60:  # the reply never started: give up
                state["done"] = True

    sender = asyncio.create_task(microphone())
    try:
        while not state["done"]:
            try:
                event = await asyncio.wait_for(connection.recv(), 0.1)
            except asyncio.TimeoutError:
                continue
            kind = event["type"]
            at = None if state["utterance_t"] is None else time.perf_counter() - state["utterance_t"]
            if kind == "response.created" and state["story"] is None:
                state["story"] = event["response"]["id"]
            elif kind == "response.output_audio.delta" and event["response_id"] == state["story"]:
                pcm = np.frombuffer(base64.b64decode(event["delta"]), np.int16)
                playback.push(pcm.astype(np.float32) / 32768)
            elif kind == "input_audio_buffer.speech_started":
                events.append((at, kind, event["item_id"]))
                if not playback.stopped and playback.started:
                    playback.stop()  # as the SDKs' clients do; then truncate what was heard
                    item = next((i for _, k, i in reversed(events) if k == "output_item"), None)
                    if item:
                        await connection.send({"type": "conversation.item.truncate", "item_id": item,
                                               "content_index": 0, "audio_end_ms": int(playback.played_s * 1000)})
            elif kind == "response.output_item.added":
                events.append((at, "output_item", event["item"]["id"]))
            elif kind == "response.done":
                response = event["response"]
                reason = (response.get("status_details") or {}).get("reason")
                events.append((at, kind, f"{response['status']}:{reason}"))
                if response["id"] == state["story"]:
                    state["story_done"] = response["status"]
                    if response["status"] == "cancelled":
                        playback.stop()
            elif kind in ("input_audio_buffer.committed", "error"):
                events.append((at, kind, json.dumps(event.get("error", {}).get("code"))))
    finally:
        state["done"] = True
        sender.cancel()
    return judge(case, events, playback, state)


def judge(case, events, playback, state):
    """The row of one case: whether the reply was interrupted, when, and whether that was right."""
    after = [(at, kind, detail) for at, kind, detail in events if at is not None]
    stops = [at for at, kind, detail in after
             if kind == "input_audio_buffer.speech_started" or (kind == "response.done" and detail.startswith("cancelled"))]
    turns = [at for at, kind, _ in after if kind == "input_audio_buffer.committed"]
    before = [kind for at, kind, _ in events if at is None and kind in ("input_audio_buffer.speech_started",
                                                                        "input_audio_buffer.committed")]
    row = {"id": case.id, "session": state["session"], "kind": case.kind, "phrase": case.phrase, "voice": case.voice, "synthesiser": case.synthesiser,
           "language": case.language, "noise": case.noise, "split": case.split, "interrupts": case.interrupts,
           "played_s": round(playback.played_s, 2), "valid": state["utterance_t"] is not None,
           "stopped_after_s": round(min(stops), 3) if stops else None, "turns": len(turns),
           "before_utterance": before}
    # Stopped before the listener said anything (by noise, or echo): a false interruption,
    # whatever came after; an interruption then cannot be measured.
    if case.interrupts and not before:
        row["missed"] = not stops or min(stops) > CANCEL_WITHIN_S
    else:
        row["false"] = bool(before or (not case.interrupts and (stops or turns)))
    return row


# --- the cached reply: a fixed story, Kokoro's audio of it kept on disk ---------------------------

STORY = ("The old lighthouse keeper climbed the stairs as the storm rolled in from the sea. Every night for "
         "forty years he had lit the great lamp, and every night the ships had found their way home. But "
         "tonight the wind was stronger than any he remembered, and the waves broke over the rocks like "
         "thunder. He checked the oil, trimmed the wick, and watched the dark water for any sign of a sail. "
         "Far out, a small fishing boat was fighting the swell, its light flickering like a firefly. The "
         "keeper turned the lamp toward it and held it steady, hour after hour, until his arms ached. At "
         "dawn the boat came limping into the harbour, and the fishermen waved to the tower on the hill.")


class StoryLLM:
    """The fixed ``STORY``, streamed word by word; continues from ``request.prefix``."""

    resumes = True

    def generate(self, request, on_text, should_stop, on_function_call=None):
        sent = 0
        for word in re.findall(r"\s*\S+", STORY[len(request.prefix):]):
            if should_stop():
                break
            on_text(word)
            sent += 1
        return {"input_tokens": 100, "output_tokens": sent}


class CachedTTS:
    """A TTS whose syntheses are kept on disk by (text, voice, speed)."""

    def __init__(self, tts, folder):
        self._tts, self._folder = tts, Path(folder)
        self.voices, self.languages = tts.voices, tts.languages
        self._folder.mkdir(parents=True, exist_ok=True)

    def resolve_voice(self, name):
        return self._tts.resolve_voice(name)

    def synthesize(self, text, voice, speed=1.0):
        key = hashlib.sha256(pickle.dumps((text, self.resolve_voice(voice), speed))).hexdigest()[:24]
        path = self._folder / f"{key}.npy"
        if path.exists():
            return np.load(path)
        samples = self._tts.synthesize(text, voice, speed)
        np.save(path, samples)
        return samples


def load_cached_reply(config):
    """The default backends with the reply made cheap: ``StoryLLM`` and ``CachedTTS``
    (``S2S_BACKEND=bench.interruptions.load_cached_reply``)."""
    from dataclasses import replace

    from pool.backends import load_default

    backends = load_default(config)
    return replace(backends, llm=StoryLLM(), tts=CachedTTS(backends.tts, corpus_folder() / "reply"))


# --- the run ---------------------------------------------------------------------------------------

def overlaps(server, rows):
    """What the server made of each case's sound: session id -> [(verdict, [[voiced ms, transcript,
    likeness], ...])], from its history (the overlap rows: each peek, then the transcript of all
    of it with voiced ms and likeness None)."""
    found = collections.defaultdict(list)
    for session, status, data in server.query("select session_id, status, data from pool_conversationitem "
                                              "where kind = 'overlap' order by at_ms"):
        heard = [[h.get("voiced_ms"), h["transcript"], h.get("likeness")]
                 for h in json.loads(data).get("heard", []) if h.get("transcript")]
        found[session].append((status, heard))
    return found


def rates(rows):
    """Per group: false interruptions (of the cases that should not interrupt), missed ones and
    the p50 time to cancel (of those that should)."""
    quiet = [r for r in rows if "false" in r]
    loud = [r for r in rows if "missed" in r]
    times = [r["stopped_after_s"] for r in loud if r["stopped_after_s"] is not None]
    return {"cases": len(rows),
            "false": f"{sum(r['false'] for r in quiet)}/{len(quiet)}" if quiet else None,
            "false_rate": round(sum(r["false"] for r in quiet) / len(quiet), 3) if quiet else None,
            "missed": f"{sum(r['missed'] for r in loud)}/{len(loud)}" if loud else None,
            "missed_rate": round(sum(r["missed"] for r in loud) / len(loud), 3) if loud else None,
            "cancel_p50_s": round(statistics.median(times), 3) if times else None}


def summary(rows):
    rows = [r for r in rows if r["valid"]]
    by = {}
    for key in ("kind", "voice", "noise", "synthesiser", "language", "split"):
        groups = collections.defaultdict(list)
        for row in rows:
            groups[row[key]].append(row)
        by[key] = {name: rates(group) for name, group in sorted(groups.items(), key=lambda kv: str(kv[0]))}
    return {"all": rates(rows), **by}


async def run_all(url, chosen, renderer, parallel):
    rows = []
    pending = list(chosen)
    lock = asyncio.Lock()

    async def worker():
        while True:
            async with lock:
                if not pending:
                    return
                case = pending.pop(0)
            try:
                for _attempt in range(POOL_FULL_RETRIES):
                    async with websockets.connect(url, max_size=None) as ws:
                        first = json.loads(await ws.recv())
                        # The pool is full while the unit of this worker's last case drains.
                        if first.get("type") != "error" or first["error"].get("code") != "session_limit_reached":
                            rows.append(await run_case(WebSocketConnection(ws, first), case, renderer))
                            break
                    await asyncio.sleep(0.5)
                else:
                    rows.append({"id": case.id, "valid": False, "error": "session_limit_reached"})
            except (OSError, websockets.WebSocketException) as exc:
                rows.append({"id": case.id, "valid": False, "error": repr(exc)})

    await asyncio.gather(*(worker() for _ in range(parallel)))
    return rows


def select(split, languages, kinds=None, limit=None):
    chosen = [c for c in cases(languages) if split == "all" or c.split == split]
    if kinds:
        chosen = [c for c in chosen if c.kind in kinds]
    return chosen[:limit] if limit else chosen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="held_out", choices=["held_out", "tune", "all"])
    parser.add_argument("--reply", default="real", choices=["real", "cached"])
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--languages", default="en")
    parser.add_argument("--kinds", default="")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--settings", default="{}", help="S2S settings for the server, as JSON")
    parser.add_argument("--rows", help="write every case's row to this JSON file")
    parser.add_argument("--project-dir", help="run the server of another checkout (a git worktree of an earlier "
                                              "commit, with this module copied in for --reply cached)")
    args = parser.parse_args(argv)
    languages = tuple(args.languages.split(","))
    chosen = select(args.split, languages, set(filter(None, args.kinds.split(","))), args.limit)
    from pool.backends.cache import default_paths
    from pool.backends.tts import KokoroTTS
    from pool.conf import DEFAULTS

    paths = default_paths(DEFAULTS["MODEL_CACHE_DIR"])
    renderer = Renderer(KokoroTTS(paths["tts_model"], paths["tts_voices"], threads=2), corpus_folder() / "utterances")
    for case in chosen:  # rendered before the server starts: no synthesis competes with it
        renderer.utterance(case)
    settings = json.loads(args.settings)
    if languages != ("en",):
        settings.setdefault("PRESET", "multilingual")
    backend = "bench.interruptions.load_cached_reply" if args.reply == "cached" else None
    server = start_server(max(args.parallel, 1), settings, backend=backend, project_dir=args.project_dir)
    started = time.perf_counter()
    try:
        rows = asyncio.run(run_all(f"{server.base_url}/realtime", chosen, renderer, args.parallel))
    finally:
        server.stop()
    heard = overlaps(server, rows)
    for row in rows:
        row["heard"] = heard.get(row.get("session"), [])
    if args.rows:
        Path(args.rows).write_text(json.dumps(rows, indent=1))
    emit("interruptions", {"split": args.split, "reply": args.reply, "settings": settings,
                           "seconds": round(time.perf_counter() - started), "summary": summary(rows),
                           "wrong": [r for r in rows if r.get("false") or r.get("missed")]})


if __name__ == "__main__":
    main()
