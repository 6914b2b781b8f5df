"""What the admin draws: a session on one time axis, and the first audio of the last hour.

``session_timeline(session)`` lays a finished (or live) session's history rows out as shapes for
``admin/pool/session/timeline.html``, an SVG the server renders (no JavaScript): the user's
speech, the assistant's audio as it was sent (and where it stopped, and why), what was heard over
the assistant and how it was taken (a backchannel dropped, echo removed, an interruption), and the
gap from each end of speech to the reply's first audio. An operator sees at a glance why a reply
stopped.

Times: rows say when something happened in milliseconds since the session started (``at_ms``), and
user speech where it lies in the input audio buffer (``audio_start_ms``). A client streams its
microphone in real time, so buffer time is session time shifted by when its audio began: the
shift is read off each user turn, whose row has both.

``first_audio_chart(responses)`` bins answered voice turns into 5-minute buckets (p50 and p95 of
``first_audio_sent_ms``) for the pool overview.
"""

import statistics
from dataclasses import dataclass, field

WIDTH = 960  # px of the drawing area
LANES = ("user", "heard over the assistant", "assistant")
LANE_HEIGHT, TOP, LEFT = 34, 26, 170


@dataclass
class Shape:
    """One thing drawn: a bar from ``start_ms`` to ``end_ms`` in ``lane``, of CSS ``kind``, with
    its ``label`` (also its tooltip)."""

    lane: int
    start_ms: float
    end_ms: float
    kind: str
    label: str
    x: float = 0.0
    width: float = 0.0
    y: float = 0.0


@dataclass
class Timeline:
    shapes: list = field(default_factory=list)
    gaps: list = field(default_factory=list)  # (x1, x2, y, label): end of speech -> first audio
    ticks: list = field(default_factory=list)  # (x, label)
    lanes: list = field(default_factory=list)  # (y, name)
    width: int = WIDTH + LEFT + 20
    height: int = TOP + LANE_HEIGHT * len(LANES) + 30
    span_ms: int = 0


def _shift(items):
    """Session ms minus buffer ms, from the user turns that know both (0 when none does)."""
    shifts = [item.at_ms - item.audio_start_ms for item in items
              if item.kind == "message" and item.role == "user" and item.audio_start_ms is not None]
    return statistics.median(shifts) if shifts else 0


def _overlap_label(item):
    """What was heard over the assistant and what it was taken for, with each peek that judged
    it, at how many ms of voiced speech (``realtime.session.history.SessionHistory.overlap``):
    "interruption: So it's my fight. ('That' at 320 ms, likeness -0.46; 'So it's my' at 640 ms,
    likeness -2.08; held 420 ms)". The last peek is the one that decided."""
    data = item.data or {}
    peeks = [f"'{h['transcript']}' at {h['voiced_ms']} ms" + (f", likeness {h['likeness']:.2f}" if h.get("likeness") is not None else "")
             for h in data.get("heard", []) if h.get("voiced_ms") is not None]
    if data.get("held_ms"):
        peeks.append(f"held {data['held_ms']} ms")
    return f"{item.status}" + (f": {item.text}" if item.text else "") + (f" ({'; '.join(peeks)})" if peeks else "")


def session_timeline(items, responses):
    """The ``Timeline`` of a session's ``ConversationItem`` rows and ``SessionResponse`` rows."""
    items, responses = list(items), list(responses)
    shift = _shift(items)
    by_response = {r.response_id: r for r in responses}
    timeline = Timeline()
    for item in items:
        if item.kind == "message" and item.role == "user" and item.audio_start_ms is not None:
            end = item.audio_end_ms if item.audio_end_ms is not None else item.audio_start_ms + 500
            timeline.shapes.append(Shape(0, item.audio_start_ms + shift, end + shift, "speech", item.text or "(no words)"))
        elif item.kind == "overlap" and item.audio_start_ms is not None:
            end = item.audio_end_ms if item.audio_end_ms is not None else item.audio_start_ms + 400
            timeline.shapes.append(Shape(1, item.audio_start_ms + shift, end + shift, item.status, _overlap_label(item)))
        elif item.kind == "message" and item.role == "assistant" and item.audio_ms:
            response = by_response.get(item.response_id)
            stopped = item.interrupted or (response is not None and response.status == "cancelled")
            reason = f" - stopped: {response.reason or response.status}" if stopped and response else ""
            timeline.shapes.append(Shape(2, item.at_ms, item.at_ms + item.audio_ms,
                                         "stopped" if stopped else "reply", (item.text or "") + reason))
            if response is not None and response.first_audio_sent_ms is not None:
                speech_end = item.at_ms - response.first_audio_sent_ms
                timeline.gaps.append([speech_end, item.at_ms, f"{response.first_audio_sent_ms / 1000:.2f} s"])
    ends = [s.end_ms for s in timeline.shapes] + [g[1] for g in timeline.gaps]
    timeline.span_ms = span = max([1000, *ends]) * 1.02
    scale = WIDTH / span

    def x(ms):
        return LEFT + max(0.0, ms) * scale

    for shape in timeline.shapes:
        shape.x, shape.width = x(shape.start_ms), max(2.0, (shape.end_ms - shape.start_ms) * scale)
        shape.y = TOP + shape.lane * LANE_HEIGHT + 6
    timeline.gaps = [(x(start), x(end), TOP + 2 * LANE_HEIGHT + 3, label) for start, end, label in timeline.gaps]
    timeline.lanes = [(TOP + i * LANE_HEIGHT + LANE_HEIGHT // 2 + 4, name) for i, name in enumerate(LANES)]
    step = next(s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600) if span / 1000 / s <= 12)
    timeline.ticks = [(x(t * 1000), f"{t} s") for t in range(0, int(span / 1000) + 1, step)]
    return timeline


CHART_WIDTH, CHART_HEIGHT, BUCKET_MINUTES = 360, 90, 5


def first_audio_chart(rows, now, minutes=60):
    """p50 and p95 of first audio per BUCKET_MINUTES over the last ``minutes``, as SVG polyline
    points: ``rows`` are ``(finished at, first_audio_sent_ms)`` of completed voice turns."""
    buckets = [[] for _ in range(minutes // BUCKET_MINUTES)]
    for at, ms in rows:
        age = (now - at).total_seconds() / 60
        if 0 <= age < minutes and ms is not None:
            buckets[len(buckets) - 1 - int(age // BUCKET_MINUTES)].append(ms)
    values = [sorted(b) for b in buckets]
    top = max([1000.0, *(v[-1] for v in values if v)])

    def points(pick):
        out = []
        for i, v in enumerate(values):
            if v:
                xx = 30 + i * (CHART_WIDTH - 40) / max(1, len(values) - 1)
                yy = 10 + (CHART_HEIGHT - 25) * (1 - pick(v) / top)
                out.append(f"{xx:.0f},{yy:.0f}")
        return " ".join(out)

    everything = sorted(ms for v in values for ms in v)
    return {"p50": points(lambda v: v[len(v) // 2]), "p95": points(lambda v: v[min(len(v) - 1, int(len(v) * 0.95))]),
            "top_s": f"{top / 1000:.1f}", "turns": len(everything), "width": CHART_WIDTH, "height": CHART_HEIGHT,
            "p50_s": f"{everything[len(everything) // 2] / 1000:.2f}" if everything else None,
            "p95_s": f"{everything[min(len(everything) - 1, int(len(everything) * 0.95))] / 1000:.2f}"
            if everything else None}
