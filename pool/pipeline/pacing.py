"""How much text the TTS may synthesize at once without the listener hearing a gap.

A client plays a reply's audio in real time from its first delta. While the TTS synthesizes the
next piece of text, the client plays what it already holds (the *lead*). If the piece takes
longer to synthesize than the lead lasts, the listener hears silence mid-reply. On a CPU where
Kokoro's real-time factor is 0.7-0.9 (BENCHMARKS.md), phrases that grow from 4 to 8 to 30 words
left 3 s of such gaps in a reply; on a fast machine the lead grows with every phrase and no
phrase needs cutting.

``SpeechPace`` learns the TTS's real-time factor and the speech length of a word from what it
has synthesized, and cuts a phrase into pieces that fit the lead (at a comma when there is one).

A synthesis cannot be paused (one ONNX run), so while other units' work waits in the compute
queue (work that is due: speculative work waits for nothing a user hears) a piece is also cut
to CONTENDED_PIECE_SECONDS of compute: at pool 4 a 30-word sentence whose own client held 2-4 s
of audio ran 1.4 s while another reply's client ran out of audio (BENCHMARKS.md 5h).
"""

import re
import threading
import weakref

MIN_PIECE_WORDS = 3  # shorter pieces sound clipped and cost Kokoro's fixed time again
SMOOTHING = 0.3  # weight of the newest measurement in the running estimates
CONTENDED_PIECE_SECONDS = 0.6  # the longest piece's compute while other work waits (BENCHMARKS.md 5h)
WAIT_MARGIN_SECONDS = 0.25  # lead kept beyond a piece's estimated compute when synthesis waits (can_wait)
_WORD = re.compile(r"\S+")


class SpeechPace:
    """Running estimates of the TTS speed, shared by the units of a process (one TTS model).

    ``real_time_factor``: compute seconds per second of audio; ``seconds_per_word``: audio per
    word. Both start from this machine's measured figures and follow the measurements.
    """

    def __init__(self, real_time_factor=0.8, seconds_per_word=0.35):
        self.real_time_factor = real_time_factor
        self.seconds_per_word = seconds_per_word
        self._lock = threading.Lock()

    def observe(self, words, audio_seconds, compute_seconds):
        """Record one synthesis: ``words`` of text became ``audio_seconds`` of speech in
        ``compute_seconds``."""
        if words <= 0 or audio_seconds <= 0:
            return
        with self._lock:
            self.real_time_factor += SMOOTHING * (compute_seconds / audio_seconds - self.real_time_factor)
            self.seconds_per_word += SMOOTHING * (audio_seconds / words - self.seconds_per_word)

    def compute_seconds(self, text):
        """The compute, in seconds, that synthesizing ``text`` is expected to take."""
        return self.real_time_factor * self.seconds_per_word * len(_WORD.findall(text))

    def can_wait(self, lead_seconds):
        """Whether the next piece may start later and still be ready before the client's
        ``lead_seconds`` of audio run out: the lead is longer than the shortest piece
        (MIN_PIECE_WORDS) takes to synthesize, by WAIT_MARGIN_SECONDS. False before the reply
        plays (None)."""
        if lead_seconds is None:
            return False
        return lead_seconds > self.real_time_factor * self.seconds_per_word * MIN_PIECE_WORDS + WAIT_MARGIN_SECONDS

    def next_piece(self, text, lead_seconds, contended=False):
        """Split ``text`` into (piece to synthesize now, rest). ``lead_seconds``: audio the client
        holds and has not played yet, or None before the reply's first audio (the first phrase
        is already short: the LLM stage cuts it so). ``contended``: other work that is due
        waits for the cores (the piece is then at most CONTENDED_PIECE_SECONDS of compute). The
        piece is the whole text when it fits. Concatenating the two gives back ``text``."""
        words = list(_WORD.finditer(text))
        if lead_seconds is None or not words:
            return text, ""
        seconds = lead_seconds  # the compute the piece may take: what the client has left to play,
        if contended:  # and no more than others should wait
            seconds = min(seconds, CONTENDED_PIECE_SECONDS)
        budget = seconds / (self.real_time_factor * self.seconds_per_word)
        fits = max(MIN_PIECE_WORDS, int(budget))
        if len(words) <= fits + 1:  # a lone last word is not worth its own synthesis
            return text, ""
        cut = words[fits - 1].end()
        for word in words[MIN_PIECE_WORDS - 1:fits]:  # the last comma within the budget
            if word.group().endswith(","):
                cut = word.end()
        return text[:cut], text[cut:]


_PACES = weakref.WeakKeyDictionary()
_PACES_LOCK = threading.Lock()


def pace_of(tts):
    """The SpeechPace of a TTS backend (one per loaded model, shared by every unit)."""
    with _PACES_LOCK:
        return _PACES.setdefault(tts, SpeechPace())
