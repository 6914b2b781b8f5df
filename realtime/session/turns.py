"""Turn-taking: when user speech is a turn, when it interrupts the assistant, when a reply starts.

``TurnTaking`` holds the turn state of one session and answers each thing that happens with the
decisions the session carries out, in order (``Announce``, ``Cancel``, ``Peek``, ``Judged``,
``Release``, ``Start``, ``Wait``, ``CatchUp``; an empty list: hold, queue or drop, nothing to do
now). It
never calls the session. ``TurnTaking.maybe_respond`` is the one place that decides to start,
queue or drop a reply of a server-VAD session (``server_vad`` or ``semantic_vad`` with
``create_response``). The rules, also in docs/PROTOCOL.md ("Turn-taking"):

- A reply starts only while the user is silent: no speech in progress or undecided, every
  committed turn transcribed, and every audio append the client sent heard by the VAD. It is built from every user turn committed before it starts.
- A turn committed while a reply is active is answered once that reply ends (queued, not lost).
- Speech that starts while an automatic reply (one started here, for a turn) has sent nothing
  yet makes that reply stale: it is cancelled at once (``turn_detected``), whatever
  ``interrupt_response`` says. The user has heard nothing of it and is still on their turn: that
  is not an interruption. Their turns are answered by the next reply.
- Speech that starts while the assistant is speaking (its reply has sent audio, or the audio sent
  is still playing on the client at real-time pace) is *undecided*: its events, and the reply's
  next events, are held back. A peek (a transcript of the speech so far, scored against a
  listener's backchannel phrases) at ``INTERRUPT_MIN_SPEECH_MS`` of voiced speech and each
  ``PEEK_STEP_MS`` after it, or at its first pause, or at its end, judges it: the first that
  hears words other than backchannels, in audio unlike any backchannel phrase
  (``BACKCHANNEL_LIKENESS``), makes it a turn, whose events then go out as they happened and
  which, with ``interrupt_response``, cancels the reply. With ``BACKCHANNEL_MAX_MS`` set (off by
  default), before that much voiced speech a peek without a cue word that is not clearly unlike a
  backchannel (``INTERRUPTION_LIKENESS``) is no verdict: the next peek, or the speech's end,
  decides (short speech that ends so is a backchannel). Speech whose every peek, the last one of
  all of it, hears none - a backchannel ("mm-hmm", "yeah"), a cough, noise - is dropped without a
  trace and the reply goes on. Speech longer than the peeks listen (``PEEK_LIMIT_MS``) is judged
  by its transcript. Clients stop their playback at ``speech_started``, so it must not be sent
  for a backchannel.
- ``semantic_vad``: a turn whose transcript ends on a word that cannot end a sentence ("for",
  "and", "the") is not answered before the eagerness fallback silence, unless the user goes on.
"""

import logging
import re
import time
import unicodedata
from dataclasses import dataclass

from pool.pipeline import messages as m
from pool.pipeline.playback import Playback
from realtime.session_config import Backchannels, effective_silence_ms

log = logging.getLogger(__name__)

PEEK_LIMIT_MS = 3000  # longer speech is judged by its whole transcript
# After the first peek (at INTERRUPT_MIN_SPEECH_MS), the next one hears each further PEEK_STEP_MS
# of voiced speech (or as soon as the STT is free, one peek at a time). Slow real speech is
# first heard as one word ("He" of "He began a confused complaint."), and with a step of 300 its
# deciding peek came at 600 ms voiced: after the 1.0 s a person waits. Chosen on the tune part
# of bench.interruption_corpus (BENCHMARKS.md, section 14c).
PEEK_STEP_MS = 150
# Words after which an English sentence is not finished (semantic_vad holds the reply).
UNFINISHED_WORDS = frozenset(
    "a an the and or but so because for of to with in on at from by about into my your our their "
    "his her its this that these those than if when while as is are was were am be like".split())
_JOIN = re.compile(r"[-'\u2019]")  # "mm-hmm" -> "mmhmm", "don't" -> "dont"
# A hum however the STT spells it ("mm-hmm", "mm-huh", "uh-huh", "hmm", "mhm", "mm-hums"): m, h,
# n and u, and perhaps a plural s.
_HUM = re.compile(r"^[mhnu]*[mh][mhnu]*s?$")
# A Latin-script "word" without a vowel is a fragment Whisper wrote for a sound ("Sh", "D", "Mmm"),
# not a word said.
_FRAGMENT = re.compile(r"^[b-df-hj-np-tv-xz]+$")
# Distinct words other than backchannels that no likeness excuses: a likeness is a mean per
# token, blind to how much of the speech a short phrase leaves unsaid (a held-out "What time does
# the pharmacy open tomorrow?" heard "Time is the pharmacy open tomorrow." at -1.1 was dropped
# as a backchannel). Whisper's words for a hum or a laugh had 1-3 such words at a backchannel's
# likeness in the corpus's tune part, but 4 in a held-out run ("Can be a chin" for "Mhm."), and
# 5 at -2.99 in the tune part (BENCHMARKS.md, section 14q).
SAID_WORDS = 5
_OUTPUT = (m.ResponseText, m.ResponseAudio, m.ResponseFunctionCall, m.ResponseFinished)


# --- the decisions the session carries out -------------------------------------------------------

@dataclass(frozen=True)
class Announce:
    """Send ``input_audio_buffer.speech_started`` for ``event`` (a SpeechStarted): speech is a turn."""

    event: object


@dataclass(frozen=True)
class Cancel:
    """Cancel the active response (``reason``: "turn_detected")."""

    reason: str


@dataclass(frozen=True)
class Peek:
    """Ask the unit for a transcript of ``item_id`` once it holds ``after_ms`` of voiced speech,
    with ``prompt`` as the STT's prompt, scored against ``phrases``
    (``pool.pipeline.messages.PeekInput``)."""

    item_id: str
    after_ms: int
    prompt: str | None
    phrases: tuple = ()


@dataclass(frozen=True)
class Release:
    """Handle these held pipeline ``events`` now, in order, then carry out ``settle()``."""

    events: tuple


@dataclass(frozen=True)
class Judged:
    """Speech over the assistant was judged: ``verdict`` "interruption" (a turn), "turn" (the
    assistant stopped before it was judged), "backchannel" (words, all of them a listener's) or
    "noise" (no words); ``event``: its SpeechStarted;
    ``heard``: what each peek heard, ``[(voiced ms, transcript, likeness or None), ...]``, and its
    transcript (voiced ms and likeness None);
    ``held_ms``: how long its events were held before the verdict. For the history and metrics."""

    verdict: str
    event: object
    heard: tuple
    held_ms: int


@dataclass(frozen=True)
class Start:
    """Start the automatic reply to the turns so far."""


@dataclass(frozen=True)
class Wait:
    """Decide again (``maybe_respond``) in ``seconds``, unless something decides sooner."""

    seconds: float


@dataclass(frozen=True)
class CatchUp:
    """Audio the client sent is not heard yet: decide again once the VAD has heard it."""


def words(transcript):
    """Lower-case words of a transcript, letters only (hyphens and apostrophes joined), without
    accents and other non-spacing marks: "Sí, d'accord" -> ["si", "daccord"]; the vowel signs
    of scripts such as Devanagari (spacing marks) stay in their word."""
    folded = unicodedata.normalize("NFKD", _JOIN.sub("", transcript.lower()))
    return "".join(_letter(c) for c in folded).split()


def _letter(c):
    kind = unicodedata.category(c)
    if kind == "Mn":
        return ""
    return c if c.isalpha() or kind == "Mc" else " "


def interrupts(peeked, backchannel_words, likeness=None, threshold=None, cues=frozenset(), whole=False):
    """True when a peek at speech over the assistant heard a word that marks an interruption
    (``cues``: "wait", "stop", ...), or words other than backchannels (``backchannel_words`` and
    hums however spelled) in audio that is not like a backchannel phrase either: its
    ``likeness`` (``pool.backends.stt.WhisperSTT.hear``) is under ``threshold`` (either None:
    the words alone decide). Whisper tiny.en writes a listener's "mm-hmm" or "uh-huh" in a voice
    it has not heard as other words ("I'm Emm Hong.", "Dye her"), which the likeness sees
    through; a short "Wait" peeked at after 300 ms may sound like "Wow", which its cue does not.
    SAID_WORDS distinct words other than backchannels interrupt however like one they sound.
    The peek's last word may be cut off ("Yeah, f-") and is then not counted, unless the peek is
    of the ``whole`` utterance (its speech had ended: "And not-" is "and not"); nor are
    fragments without a vowel ("Sh", "D")."""
    if heard_cue(peeked, cues, whole):
        return True
    said = [w for w in _peeked_words(peeked, whole) if not _FRAGMENT.match(w)]
    other = {w for w in said if w not in backchannel_words and not _HUM.match(w)}
    if not other:
        return False
    return likeness is None or threshold is None or likeness < threshold or len(other) >= SAID_WORDS


def heard_cue(peeked, cues, whole=False):
    """True when a peek (of the ``whole`` utterance or not) heard a whole word that marks an
    interruption (``cues``)."""
    return any(w in cues for w in _peeked_words(peeked, whole))


def lone_word(peeked, cues=frozenset()):
    """True when a peek heard one whole word that is not a cue ("Ice" for "I see", "And" of
    "And Mm-"): at the first peek, 300 ms into speech, Whisper tiny.en's one word is a coin toss
    between a backchannel and an interruption (#27's e2e "I see." in bm_george's voice was heard
    "Ice" in 3 of 5 runs), so the next peek decides. A cut-off last word and fragments without
    a vowel are not counted, as in ``interrupts``."""
    said = [w for w in _peeked_words(peeked) if not _FRAGMENT.match(w)]
    return len(said) == 1 and said[0] not in cues


def _peek_timing(timing):
    """The log's account of where a peek's time went (``SpeechPeeked.timing``), or ""."""
    if timing is None:
        return ""
    lag, wait, compute = timing
    behind = "" if lag is None else f"the VAD {lag} ms behind the audio, "
    return f"; {behind}waited {wait} ms for the STT, heard in {compute} ms"


def _peeked_words(peeked, whole=False):
    """``words(peeked)`` without its last word when the peek cut it off ("Yeah, f-"); a peek of
    the ``whole`` utterance cut nothing off. An ellipsis is speech trailing off, after a whole
    word ("And so...": "so" was said) or a fragment ("S...", which is no word anyway)."""
    said = words(peeked)
    return said[:-1] if not whole and peeked.rstrip().endswith("-") else said


class _Undecided:
    """Speech over the assistant, not yet known to be a turn: its held pipeline events."""

    def __init__(self, started):
        self.started = started  # the SpeechStarted event
        self.since = time.monotonic()
        self.held = []
        self.heard = []  # (voiced ms, transcript) of each peek, then (None, its transcript)
        self.peeks = 0  # peeks asked for
        self.peek_pending = False
        self.judged_whole = False  # a peek heard it to its end
        self.ended = False  # its transcript (or its failure) is among the held events

    def judged(self, verdict):
        return Judged(verdict, self.started, tuple(self.heard), int((time.monotonic() - self.since) * 1000))


class TurnTaking:
    """The turn state of one session. Every method that reports something returns the list of
    decisions (above) the session carries out, in order.

    ``session_id``: for the log; ``conversation``: the session's ``Conversation`` (the turns'
    transcripts); ``min_speech_ms``: INTERRUPT_MIN_SPEECH_MS (0: any speech interrupts at once, as
    on OpenAI's service); ``backchannels``: a ``realtime.session_config.Backchannels`` (whose
    words and phrases of the user's ``language`` count too); ``playback``: the session's
    ``pool.pipeline.playback.Playback`` (what the client plays). The session keeps
    ``turn_detection`` and ``replies`` (the session is "realtime", not transcription-only) current,
    and ``input_heard`` (False while appends it sent are not through the VAD).
    """

    @property
    def language(self):
        """The language the user speaks (ISO 639-1; None: unknown), for backchannels."""
        return self._language

    @language.setter
    def language(self, language):
        self._language = language
        self._backchannels = self._english | self._by_language.get(language, frozenset())
        self._phrases = self._rule.phrases_for(language or "en")
        self._cues = self._english_cues | self._cues_by_language.get(language, frozenset())

    def __init__(self, session_id, conversation, min_speech_ms, backchannels=None, playback=None):
        self._session_id = session_id
        self._conversation = conversation
        self.playback = playback or Playback()  # what the client plays of the replies
        self._min_speech_ms = min_speech_ms
        self._rule = backchannels or Backchannels()
        self._english = frozenset(w for word in self._rule.words for w in words(word))
        self._by_language = {lang: frozenset(w for word in ws for w in words(word))
                             for lang, ws in self._rule.by_language.items()}
        self._english_cues = frozenset(w for word in self._rule.cues for w in words(word))
        self._cues_by_language = {lang: frozenset(w for word in ws for w in words(word))
                                  for lang, ws in self._rule.cues_by_language.items()}
        self.language = None
        self.turn_detection = None  # the session's audio.input.turn_detection (None: manual turns)
        self.replies = True  # the session answers turns (type "realtime")
        self.input_heard = True
        self.response = None  # the active Response (response_created .. response_ended)
        self.speaking = None  # item id of the user's speech in progress
        self.undecided = {}  # item id -> _Undecided, oldest first
        self._held_output = []  # the reply's events held while speech is undecided
        self.untranscribed = set()  # committed items whose transcript is not back yet
        self.unanswered = []  # committed user items that no reply has seen yet
        self._speech_end = 0.0  # time.monotonic() of the last speech_stopped
        self._idle_from = time.monotonic()  # when the idle timeout was last (re)configured
        self.timing_out = False  # the session asked the VAD to commit the silence (TimeoutInput)
        self._prompted = set()  # items committed by the idle timeout: answered whatever they hold

    # --- routing ------------------------------------------------------------------------------

    def intercept(self, event):
        """The decisions for a pipeline event held or consumed here, or None when the session
        handles it as usual."""
        undecided = self.undecided.get(getattr(event, "item_id", None))
        if undecided is not None:
            return self._undecided_event(undecided, event)
        if self.undecided and isinstance(event, _OUTPUT):
            self._held_output.append(event)
            return []
        return [] if isinstance(event, m.SpeechPeeked) else None  # a peek at speech already decided

    # --- user speech --------------------------------------------------------------------------

    def speech_started(self, event):
        if self._min_speech_ms and self._assistant_speaking():
            undecided = self.undecided[event.item_id] = _Undecided(event)
            return [self._ask_peek(undecided)]
        return self._begin(event)

    def speech_stopped(self):
        self._speech_end = time.monotonic()
        return []

    def committed(self, item_id):
        if self.speaking == item_id:
            self.speaking = None
        self.untranscribed.add(item_id)
        self.unanswered.append(item_id)
        return self.maybe_respond()

    def transcribed(self, item_id):
        """The item's transcript (or its failure) is in."""
        self.untranscribed.discard(item_id)
        return self.maybe_respond()

    def configure(self, turn_detection, replies):
        """The session's ``turn_detection`` and whether it answers turns (type "realtime"). A new
        idle timeout counts from now."""
        if (turn_detection or {}).get("idle_timeout_ms") != (self.turn_detection or {}).get("idle_timeout_ms"):
            self._idle_from = time.monotonic()
        self.turn_detection, self.replies = turn_detection, replies

    def idle_wait(self):
        """Seconds until server_vad's ``idle_timeout_ms`` runs out, or None when none runs (not
        set, or the user is speaking, or a reply or a turn is under way). It counts from when the
        assistant's audio has played at the client's real-time pace, or from the last speech, or
        from when it was set, whichever is latest (OpenAI's rule)."""
        td = self.turn_detection or {}
        idle_ms = td.get("idle_timeout_ms") if td.get("type") == "server_vad" else None
        if (not idle_ms or not self.replies or self.timing_out or self.response is not None or self.speaking
                or self.undecided or self.untranscribed):
            return None
        since = max(self.playback.end, self._speech_end, self._idle_from)
        return since + idle_ms / 1000 - time.monotonic()

    def timed_out(self, item_id):
        """The idle timeout committed ``item_id`` (None: speech had begun): it is answered, even
        if it holds no words."""
        self.timing_out = False
        self._idle_from = time.monotonic()  # the silence so far is answered (or speech began)
        if item_id is not None:
            self._prompted.add(item_id)

    def input_reset(self):
        """The input buffer was cleared, or turn detection switched off: no speech goes on."""
        self.speaking = None
        self.undecided.clear()
        return self.settle()

    def _begin(self, event):
        self.speaking = event.item_id
        decisions = [Announce(event)]
        td, response = self.turn_detection, self.response
        stale = response is not None and response.automatic and not response.output.items
        if response is not None and (stale or (td and td.get("interrupt_response"))):
            decisions.append(Cancel("turn_detected"))
        return decisions

    def _assistant_speaking(self):
        response = self.response
        return (response is not None and response.output.audio_ms > 0) or self.playback.playing()

    # --- speech over the assistant ------------------------------------------------------------

    def _ask_peek(self, undecided):
        undecided.peeks += 1
        undecided.peek_pending = True
        step = min(self._min_speech_ms, PEEK_STEP_MS)
        after_ms = self._min_speech_ms + (undecided.peeks - 1) * step
        return Peek(undecided.started.item_id, after_ms, self._rule.prompt, self._phrases)

    def _undecided_event(self, undecided, event):
        """Speech over the assistant is judged by peeks, one at INTERRUPT_MIN_SPEECH_MS of voiced
        speech and one at each PEEK_STEP_MS after it: the first that hears words other than
        backchannels makes it a turn. If it ends with none, it was a backchannel or noise."""
        if isinstance(event, m.SpeechPeeked):
            undecided.peek_pending = False
            undecided.heard.append((event.voiced_ms, event.transcript, event.likeness))
            log.info("session %s: speech over the assistant, %d ms voiced, heard %r (likeness %s)%s", self._session_id,
                     event.voiced_ms, event.transcript, event.likeness, _peek_timing(event.timing))
            if interrupts(event.transcript, self._backchannels, event.likeness, self._rule.likeness, self._cues,
                          whole=event.final):
                unsure = self._unsure(event)
                if (not event.final and event.voiced_ms < PEEK_LIMIT_MS
                        and (unsure or undecided.peeks == 1 and lone_word(event.transcript, self._cues)
                             and not self._clearly_unlike(event))):
                    return [self._ask_peek(undecided)]  # no verdict yet: the next peek decides
                if not (event.final and unsure):
                    return self._confirm(undecided)
                # It ended short, without a cue, not clearly unlike a backchannel: it was one.
            undecided.judged_whole = undecided.judged_whole or event.final
            if undecided.ended:
                return self._drop(undecided)
            if not event.final and event.voiced_ms < PEEK_LIMIT_MS:
                return [self._ask_peek(undecided)]  # still speaking: listen to the next stretch
            return []
        undecided.held.append(event)
        if isinstance(event, m.Transcribed):
            undecided.heard.append((None, event.transcript, None))
            if (not undecided.judged_whole and not undecided.peek_pending
                    and interrupts(event.transcript, self._backchannels, cues=self._cues, whole=True)):
                return self._confirm(undecided)  # longer than the peeks listen: judged by its transcript
        if isinstance(event, (m.Transcribed, m.TranscriptionFailed)):
            undecided.ended = True
            if not undecided.peek_pending:
                return self._drop(undecided)
        return []

    def _clearly_unlike(self, peeked):
        """True when a peek sounds less like every backchannel phrase than INTERRUPTION_LIKENESS:
        its one word ("Tell" at -7.5, "Can" at -4.5) is the start of a request, not a listener's
        "I see" heard as "Ice", and need not wait for the next peek."""
        return self._likeness_judged(peeked) and peeked.likeness < self._rule.unlike

    def _likeness_judged(self, peeked):
        """True when the peek was scored against the backchannel phrases and the session has a
        threshold to compare it with (an STT without ``hear``, or INTERRUPTION_LIKENESS None,
        leaves only the words to judge by)."""
        return peeked.likeness is not None and self._rule.unlike is not None

    def _unsure(self, peeked):
        """True when a peek (a SpeechPeeked) that would interrupt is no verdict: under
        BACKCHANNEL_MAX_MS of voiced speech, no cue word, and a likeness at or above
        INTERRUPTION_LIKENESS. Whisper tiny.en writes words for a hum or a laugh in a voice it
        never heard ("Dye her" -2.5, "I'm high." -2.1, "So it's my" -3.5), which end within about
        0.75 s; a real request sounds less like any backchannel (-3.6 to -8.8 at 480 ms voiced in
        the interruption corpus's tune part) or goes on."""
        return (peeked.voiced_ms < (self._rule.max_ms or 0) and self._likeness_judged(peeked)
                and not self._clearly_unlike(peeked) and not heard_cue(peeked.transcript, self._cues, peeked.final))

    def _confirm(self, undecided, verdict="interruption"):
        """A real turn: it interrupts as any speech does, then its events go out as they
        happened (and then ``settle``). ``verdict``: "turn" when the assistant had stopped."""
        del self.undecided[undecided.started.item_id]
        return [undecided.judged(verdict), *self._begin(undecided.started), Release(tuple(undecided.held))]

    def _drop(self, undecided):
        """A backchannel or noise: no event, no item, no turn; the reply goes on."""
        del self.undecided[undecided.started.item_id]
        verdict = "backchannel" if any(words(transcript) for _, transcript, _ in undecided.heard) else "noise"
        return [undecided.judged(verdict), *self.settle(), *self.maybe_respond()]

    def settle(self):
        """Undecided speech that no longer overlaps the assistant is ordinary speech; with none
        left undecided, the held reply events go out in order."""
        if self.undecided and not self._assistant_speaking():
            return self._confirm(next(iter(self.undecided.values())), "turn")  # its Release settles again
        if self.undecided or not self._held_output:
            return []
        held, self._held_output = self._held_output, []
        return [Release(tuple(held))]

    # --- the assistant ------------------------------------------------------------------------

    def response_truncated(self):
        """The client cut the reply it was playing (``conversation.item.truncate``)."""
        self.playback.stopped()

    def response_created(self, response):
        """Every committed turn so far is in this reply's input."""
        self.response = response
        response.turns, self.unanswered = self.unanswered, []

    def response_ended(self, response, status, reason=None):
        """``status``: the response.done status; ``reason``: a cancellation's reason."""
        self.response = None
        if status == "cancelled":
            self.playback.stopped()  # the client stops playing what it had
        if reason == "turn_detected":
            self.unanswered = response.turns + self.unanswered  # answered by the next reply
        return [*self.settle(), *self.maybe_respond()]

    # --- the decision -------------------------------------------------------------------------

    def maybe_respond(self):
        """Start a reply now (``Start``), or later (``Wait``, ``CatchUp``, or nothing: decided
        again when the reply ends, the speech ends or the transcript is in), or drop it."""
        td = self.turn_detection
        if not (td and td.get("create_response") and self.replies):
            self.unanswered = []
            return []
        if self.response is not None or self.speaking or self.undecided or self.untranscribed:
            return []
        if not self.input_heard:  # audio sent but not yet heard may hold more of the turn
            return [CatchUp()]
        said = [item_id for item_id in self.unanswered
                if self._conversation.transcript(item_id) or item_id in self._prompted]
        if not said:
            self.unanswered = []  # silence or noise transcribed as nothing: no reply
            return []
        wait = self._unfinished_wait(td, said[-1])
        if wait > 0:
            return [Wait(wait)]
        return [Start()]

    def may_speculate(self, item_id, transcript):
        """Whether a reply may be started on ``transcript`` of ``item_id``, speech in progress at
        its first pause: it would be answered at once if it were committed now (the rules of
        ``maybe_respond``), with words (semantic_vad: not ending mid-sentence)."""
        td = self.turn_detection
        if not (td and td.get("create_response") and self.replies) or self.speaking != item_id:
            return False
        if self.response is not None or self.undecided or self.untranscribed:
            return False
        said = words(transcript)
        return bool(said) and not (td["type"] == "semantic_vad" and said[-1] in UNFINISHED_WORDS)

    def _unfinished_wait(self, td, item_id):
        """semantic_vad: seconds to wait before answering a turn that ends mid-sentence."""
        if td["type"] != "semantic_vad":
            return 0.0
        said = words(self._conversation.transcript(item_id))
        if not said or said[-1] not in UNFINISHED_WORDS:
            return 0.0
        return effective_silence_ms(td) / 1000 - (time.monotonic() - self._speech_end)
