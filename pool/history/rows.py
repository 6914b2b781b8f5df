"""The writes of session, unit and history rows (sync, on the recorder thread, inside its
transaction). Each write may run twice (a batch whose commit an outage cut off is written
again), so each is idempotent: creates ignore a row already there, updates set values.

``ItemRecord`` and ``ResponseRecord`` are what a session hands over of its conversation
(``realtime.session.history`` builds them).
"""

from dataclasses import dataclass
from datetime import timedelta

from pool.states import SessionState, UnitState


@dataclass(frozen=True)
class ItemRecord:
    """A conversation item of a session, as it ended (``pool.models.ConversationItem``'s fields)."""

    item_id: str
    kind: str
    role: str
    status: str
    text: str
    at_ms: int
    data: dict
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None
    audio_ms: int | None = None
    interrupted: bool = False
    voice: str = ""
    language: str = ""
    response_id: str = ""


@dataclass(frozen=True)
class ResponseRecord:
    """A response of a session, as it ended; ``timings``: a ``pool.pipeline.timings.TurnTimings`` for
    a voice turn, else None (``pool.models.SessionResponse``'s fields)."""

    response_id: str
    status: str
    reason: str
    at_ms: int
    input_tokens: int | None = None
    output_tokens: int | None = None
    timings: object = None


def session_started(process_id, session_id, unit_index, api_key_id, client_address, transport, now):
    from pool.models import Session

    Session.objects.get_or_create(session_id=session_id, defaults=dict(
        process_id=process_id, unit_index=unit_index, created_at=now, api_key_id=api_key_id,
        client_address=client_address, transport=transport))


def session_ended(session_id, reason, close_code, counts, now, release_after):
    """``release_after``: seconds the row is kept before the history may be pruned."""
    from pool.models import Session

    Session.objects.filter(session_id=session_id).update(
        ended_at=now, end_reason=reason, close_code=close_code,
        release_after=now + timedelta(seconds=release_after), **counts)


def update_session(session_id, fields):
    from pool.models import Session

    Session.objects.filter(session_id=session_id).update(**fields)


def history(model, fields):
    """One ``ConversationItem`` or ``SessionResponse`` row (``fields`` already storable)."""
    model.objects.bulk_create([model(**fields)], ignore_conflicts=True)


def unit_changed(process_id, index, old, new, session_id, now, seq):
    """A unit's state change and what it means for its session's row. Only a newer change is
    written: a claim writes its row at once (``pool.access.admission``), ahead of the queue."""
    from pool.models import Session, Unit

    Unit.objects.filter(process_id=process_id, index=index, state_seq__lt=seq).update(
        state=new, session_id=session_id if new != UnitState.IDLE else "", state_since=now, state_seq=seq)
    sessions = Session.objects.filter(session_id=session_id)
    if new == UnitState.DRAINING:
        sessions.update(state=SessionState.DRAINING)
    elif old == UnitState.DRAINING and new == UnitState.IDLE:
        sessions.update(state=SessionState.ENDED, drained_at=now)
    elif new == UnitState.QUARANTINED:
        sessions.update(state=SessionState.QUARANTINED, quarantined_at=now)
    elif old == UnitState.QUARANTINED and new == UnitState.IDLE:
        sessions.update(state=SessionState.RELEASED)
