"""Opt-in session recordings: the user's audio and the assistant's, as two FLAC files.

While a session runs, its unit's VAD thread appends the user's audio (as the VAD hears it: mono,
16 kHz) to a temporary PCM16 file. The assistant's side is what the session sent the client:
the session (on the event loop) hands over each phrase it forwards (``sent``: a deque append,
nothing more), and the TTS thread writes those phrases to a second file before it speaks the
next (``write_sent``). Audio the session did not forward (a cancelled reply's last phrase) is
not in it. One writer a file, so no lock, and at most a reply's phrases wait in memory. When the
session's drain has passed every stage, ``save`` writes what is left, encodes both files with
soundfile (libsndfile) as FLAC on a thread of its own and stores them through Django's
``default_storage`` (the file system, S3 or any storage backend), then removes the temporary files.

The assistant file is the replies one after another, as sent (the session history says where
each began and where one was cut: ``ConversationItem.at_ms``).
"""

import collections
import logging
import tempfile
import threading
from pathlib import PurePosixPath

import numpy as np
import soundfile
from django.core.files import File
from django.core.files.storage import default_storage
from django.utils import timezone

from .backends import SPEECH_RATE, TTS_RATE

log = logging.getLogger(__name__)

RATES = {"user": SPEECH_RATE, "assistant": TTS_RATE}  # Hz
FOLDER = "s2s-recordings"
BLOCK_SAMPLES = 1 << 20  # samples encoded at a time


class SessionRecording:
    """The recording of session ``session_id`` while it runs. ``user(samples)`` and
    ``sent(samples)`` take float32 arrays in [-1, 1] at ``RATES[side]``."""

    def __init__(self, session_id):
        self.session_id = session_id
        self._raw = {side: tempfile.TemporaryFile(prefix="s2s-recording-") for side in RATES}
        self.samples = dict.fromkeys(RATES, 0)
        self._sent = collections.deque()  # assistant phrases forwarded, not yet written

    def user(self, samples):
        """The VAD thread: client audio as decoded (16 kHz)."""
        self._write("user", samples)

    def sent(self, samples):
        """The event loop: a phrase of the assistant forwarded to the client (24 kHz)."""
        self._sent.append(samples)

    def write_sent(self):
        """The TTS thread: write the phrases forwarded so far."""
        while self._sent:
            self._write("assistant", self._sent.popleft())

    def _write(self, side, samples):
        self._raw[side].write((np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes())
        self.samples[side] += len(samples)

    def save(self, on_saved):
        """Encode and store both sides on a new thread, then call ``on_saved({side: name})``
        (storage names; a side with no audio is left out). Call once no stage writes any more."""
        threading.Thread(target=self._save, args=(on_saved,), daemon=True,
                         name=f"recording-{self.session_id}").start()

    def _discard(self):
        """Close the temporary files (closing deletes them). A recording that is never saved (a
        drain that never ends) is closed the same way when it is garbage-collected."""
        for raw in self._raw.values():
            raw.close()

    def _save(self, on_saved):
        names = {}
        try:
            self.write_sent()
            day = timezone.now().strftime("%Y/%m/%d")
            for side, raw in self._raw.items():
                if self.samples[side]:
                    name = str(PurePosixPath(FOLDER, day, f"{self.session_id}-{side}.flac"))
                    names[side] = self._store(name, raw, RATES[side])
        except Exception:  # noqa: BLE001 - a storage error loses this recording, nothing else
            log.exception("session %s: its recording could not be stored", self.session_id)
        finally:
            self._discard()
        if names:
            on_saved(names)

    @staticmethod
    def _store(name, raw, rate):
        raw.seek(0)
        with tempfile.TemporaryFile(prefix="s2s-recording-", suffix=".flac") as flac:
            with soundfile.SoundFile(flac, "w", samplerate=rate, channels=1, format="FLAC",
                                     subtype="PCM_16") as encoded:
                while block := raw.read(BLOCK_SAMPLES * 2):
                    encoded.write(np.frombuffer(block, "<i2"))
            flac.seek(0)
            return default_storage.save(name, File(flac, name=name))
