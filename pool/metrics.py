"""Prometheus metrics of this process (prometheus-client), served at ``GET /metrics``.

Each ``runpool`` process exposes its own; the ``process`` label (host:pid) tells them apart when
one Prometheus scrapes several.
"""

import os
import socket

from prometheus_client import Counter, Gauge, Histogram

from pool.states import UnitState

PROCESS = f"{socket.gethostname()}:{os.getpid()}"
# Latency buckets (seconds): turn stages run from tens of milliseconds to a few seconds.
BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0)

UNITS = Gauge("s2s_units", "Units of the pool by state.", ["process", "state"])
SESSIONS_STARTED = Counter("s2s_sessions_started", "Sessions that claimed a unit.", ["process"])
SESSIONS_ENDED = Counter("s2s_sessions_ended", "Sessions ended, by reason.", ["process", "reason"])
SESSIONS_REFUSED = Counter("s2s_sessions_refused", "Connections refused, by error code.", ["process", "code"])
QUARANTINES = Counter("s2s_quarantines", "Units quarantined after a drain missed its deadline.", ["process"])
RELEASES = Counter("s2s_releases", "Quarantined units released by an operator.", ["process"])
ERRORS = Counter("s2s_errors", "error events sent to clients, by code.", ["process", "code"])
TURN_FIRST_AUDIO = Histogram("s2s_turn_first_audio_seconds",
                             "From speech_stopped to the first audio delta sent.", ["process"], buckets=BUCKETS)
SPECULATIONS = Counter("s2s_stt_speculations", "Transcripts made at a pause before the turn ended: "
                       "used by the commit, or discarded because the user went on.", ["process", "outcome"])
OVERLAPS = Counter("s2s_overlaps", "Sound heard over the assistant's speech, by what it was taken for: "
                   "interruption or turn, backchannel or noise (dropped), echo (removed).", ["process", "kind"])
SPECULATIVE_REPLIES = Counter("s2s_speculative_replies", "Replies started at the first pause of a turn, before "
                              "its commit: used (the turn ended there, with those words) or discarded.",
                              ["process", "outcome"])
COMPUTE_CALLS = Counter("s2s_compute_calls", "Model calls of the shared compute queue, by how they ran: alone, "
                        "in a batch, side_by_side (two at once, one core each) or in the background lane.",
                        ["process", "how"])
STAGE_SECONDS = Histogram("s2s_stage_seconds", "Compute time of a stage in one turn.", ["process", "stage"],
                          buckets=BUCKETS)


def unit_changed(registry, old, new):
    """Refresh the unit gauges after a state change (called under the registry lock)."""
    counts = dict.fromkeys(UnitState.values, 0)
    for unit in registry.units:
        counts[unit.state] = counts.get(unit.state, 0) + 1
    for state, count in counts.items():
        UNITS.labels(PROCESS, state).set(count)
    if new == UnitState.QUARANTINED:
        QUARANTINES.labels(PROCESS).inc()
    elif old == UnitState.QUARANTINED and new == UnitState.IDLE:
        RELEASES.labels(PROCESS).inc()


def turn(timings):
    """Observe one voice turn's ``pool.pipeline.timings.TurnTimings``."""
    if timings.first_audio_sent_ms is not None:
        TURN_FIRST_AUDIO.labels(PROCESS).observe(timings.first_audio_sent_ms / 1000)
    for stage, ms in (("stt", timings.stt_compute_ms), ("llm_first_phrase", timings.llm_compute_ms),
                      ("tts_first_phrase", timings.tts_first_compute_ms)):
        if ms:
            STAGE_SECONDS.labels(PROCESS, stage).observe(ms / 1000)
