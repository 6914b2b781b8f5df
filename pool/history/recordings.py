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

A storage error (the temporary folder or the media storage full, read-only or gone) costs the
recording and nothing else: it is logged in one line, the recording stops (its temporary files
are removed), and a file the storage had begun to write is deleted, so no file is left that no
row points to. The session, its turns and its history go on.
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

from pool.backends.base import SPEECH_RATE, TTS_RATE
from realtime.audio import float_to_pcm16  # what was on the wire, as it was framed there

log = logging.getLogger(__name__)

RATES = {"user": SPEECH_RATE, "assistant": TTS_RATE}  # Hz
FOLDER = "s2s-recordings"
BLOCK_SAMPLES = 1 << 20  # samples encoded at a time


class SessionRecording:
    """The recording of session ``session_id`` while it runs. ``user(samples)`` and
    ``sent(samples)`` take float32 arrays in [-1, 1] at ``RATES[side]``."""

    def __init__(self, session_id):
        self.session_id = session_id
        self.samples = dict.fromkeys(RATES, 0)
        self._sent = collections.deque()  # assistant phrases forwarded, not yet written
        self.stopped = False  # by a storage error: nothing more is written or stored
        self._raw = {}
        try:
            for side in RATES:
                self._raw[side] = tempfile.TemporaryFile(prefix="s2s-recording-")
        except OSError as exc:
            self._stop(exc)

    def user(self, samples):
        """The VAD thread: client audio as decoded (16 kHz)."""
        self._write("user", samples)

    def sent(self, samples):
        """The event loop: a phrase of the assistant forwarded to the client (24 kHz)."""
        if not self.stopped:
            self._sent.append(samples)

    def write_sent(self):
        """The TTS thread: write the phrases forwarded so far."""
        while self._sent:
            self._write("assistant", self._sent.popleft())

    def _write(self, side, samples):
        if self.stopped:
            return
        try:
            self._raw[side].write(float_to_pcm16(samples))
        except (OSError, ValueError) as exc:  # ValueError: closed by the other side's _stop
            self._stop(exc)
            return
        self.samples[side] += len(samples)

    def _stop(self, exc):
        """A storage error: the recording ends here (logged once), its temporary files go."""
        if self.stopped:
            return
        self.stopped = True
        log.error("session %s: its recording stopped, the session goes on: %s", self.session_id, exc)
        self._sent.clear()
        self._discard()

    def save(self, on_saved):
        """Encode and store both sides on a new thread, then call ``on_saved({side: name})``
        (storage names; a side with no audio is left out). Call once no stage writes any more."""
        threading.Thread(target=self._save, args=(on_saved,), daemon=True,
                         name=f"recording-{self.session_id}").start()

    def _discard(self):
        """Close the temporary files (closing deletes them). A recording that is never saved (a
        drain that never ends) is closed the same way when it is garbage-collected."""
        for raw in self._raw.values():
            try:
                raw.close()
            except OSError:
                pass  # the buffered rest could not be written (a full disk): the file goes all the same

    def _save(self, on_saved):
        names = {}
        self.write_sent()
        day = timezone.now().strftime("%Y/%m/%d")
        for side, raw in self._raw.items():
            if self.samples[side] and not self.stopped:
                name = str(PurePosixPath(FOLDER, day, f"{self.session_id}-{side}.flac"))
                try:
                    names[side] = self._store(name, raw, RATES[side])
                except Exception as exc:  # noqa: BLE001 - any storage backend's error costs the recording only
                    self._stop(exc)
        self._discard()
        if names:  # a side stored before an error is kept, and its row points to it
            on_saved(names)

    @staticmethod
    def _store(name, raw, rate):
        """Encode ``raw`` (PCM16) as FLAC and store it; returns the storage name. A file the
        storage began to write is deleted when it fails."""
        raw.seek(0)
        with tempfile.TemporaryFile(prefix="s2s-recording-", suffix=".flac") as flac:
            with soundfile.SoundFile(flac, "w", samplerate=rate, channels=1, format="FLAC",
                                     subtype="PCM_16") as encoded:
                while block := raw.read(BLOCK_SAMPLES * 2):
                    encoded.write(np.frombuffer(block, "<i2"))
            flac.seek(0)
            name = default_storage.get_available_name(name)  # save() keeps a free name as it is
            try:
                return default_storage.save(name, File(flac, name=name))
            except Exception:
                _delete_partial(name)
                raise


def _delete_partial(name):
    """Delete what a failed ``default_storage.save(name)`` left (FileSystemStorage leaves the
    bytes it wrote before the disk filled)."""
    try:
        if default_storage.exists(name):
            default_storage.delete(name)
    except OSError as exc:
        log.error("recording %s: a partly written file could not be deleted: %s", name, exc)
