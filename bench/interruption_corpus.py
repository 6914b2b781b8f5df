"""The interruption corpus: speech and sounds said over a playing reply, made deterministically.

Each ``Case`` is something a listener does while the assistant speaks, in one voice and one noise
level: a **backchannel** ("mm-hmm", "yeah", "I see", laughter), a **non-speech** sound (a cough,
a breath, a phone's keypad tone), a **real interruption** ("wait", "sorry, what?", a new question,
a correction, a new request without any cue word), or the reply's own **echo** (a client on
laptop speakers without echo cancellation), alone or with a real interruption on top. Backchannels, non-speech and echo
alone must leave the reply playing; interruptions must cancel it.

Voices are never the reply's (the default ``alloy``, Kokoro's ``af_alloy``) and come from more
than one synthesiser: Kokoro-82M (the server's own TTS, other voices and accents), espeak-ng
(Debian's ``espeak-ng``, voice variants at several pitches and speeds: a formant synthesiser
nothing in the server was tuned on), and real human speech (cuts of ``jfk.flac``,
``hotwords.mp3`` and each speaker of ``stereo_diarization.wav``; no human backchannel recording
was found in any installed package). Non-speech
is synthesised here (coughs and breaths: shaped noise) or taken from a package (pipecat's DTMF
tones, recorded keypad sounds).

Noise: pink noise (1/f, seeded per case) at 20 dB and 10 dB SNR against the utterance's active
level, present in the microphone from the start of the case, or none. Echo: the reply's audio
as the client plays it, ``delay_ms`` late, ``gain_db`` quieter, through a room (an exponentially
decaying noise impulse response, RT60 ``rt60_s``: ``room``), computed as the client plays
(``bench.interruptions.Microphone``).

**Split.** Cases are split by voice: the ``tune`` part holds about half the voices of each
synthesiser and the two speakers of ``stereo_diarization.wav``, the ``held_out`` part the rest,
the other human recordings (JFK, hotwords), and the echo cases whose parameters differ from the
tuned ones. Rules are tuned on ``tune`` and reported on ``held_out``
(``bench.interruptions``).

    cases(languages=("en",)) -> [Case, ...]
    Renderer(tts).utterance(case) -> float32 @ 24 kHz (the listener's part, without noise or echo)
"""

import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
import soxr

from realtime.client import load_audio
from tests.helpers import AUDIO_DIR, HOTWORDS, JFK

STEREO = AUDIO_DIR / "stereo_diarization.wav"  # two speakers, one a channel
RATE = 24_000  # Hz: the protocol's PCM16 rate, which every case is rendered at
REPLY_VOICE = "af_alloy"  # the default session's voice (alloy): never a case's voice

# --- what is said ----------------------------------------------------------------------------

BACKCHANNELS = {
    "en": ["Mm-hmm.", "Uh-huh.", "Mhm.", "Yeah.", "Yep.", "Okay.", "Right.", "I see.", "Sure.", "Wow.", "Oh.",
           "Ha ha ha."],  # the last: laughter, as a synthesiser says it
    "es": ["Sí.", "Vale.", "Ajá."],
    "fr": ["Oui.", "D'accord.", "Ah bon."],
    "it": ["Sì.", "Certo.", "Ah."],
    "pt": ["Sim.", "Tá bom.", "Ah."],
    "hi": ["हाँ।", "अच्छा।", "ठीक है।"],
}
INTERRUPTIONS = {
    "en": ["Wait.", "Stop.", "No, no.", "Hold on.", "Sorry, what?", "What time does the pharmacy open tomorrow?",
           "No, I said Tuesday, not Thursday."],
    "es": ["Espera.", "Perdona, ¿qué hora es?"],
    "fr": ["Attends.", "Pardon, quelle heure est-il ?"],
    "it": ["Aspetta.", "Scusa, che ore sono?"],
    "pt": ["Espera.", "Desculpa, que horas são?"],
    "hi": ["रुको।", "माफ़ कीजिए, कितने बजे हैं?"],
}
# Interruptions without a word of INTERRUPTION_WORDS: a new request, said over the reply. Every
# phrase above holds a cue ("what", "no"), so only these (and the human recordings) show whether
# speech that is neither a cue nor a backchannel interrupts. Their noise levels turn on their own
# count, so the cases above keep theirs.
REQUESTS = {
    "en": ["Tell me about the moon instead.", "Can you make it shorter?", "Let's talk about something else."],
}
NON_SPEECH = ["cough", "breath", "dtmf"]
# Real human speech, cut from the shared recordings: (name, file, channel (None: the channels'
# mean), start s, end s, what is said, split). The two speakers of stereo_diarization.wav (one a
# channel) are the tune part's human voices, so that a rule for slow, real speech can be tuned
# without looking at the held-out recordings.
HUMAN = [
    ("jfk-fellow-americans", JFK, None, 0.20, 2.30, "And so my fellow Americans.", "held_out"),
    ("jfk-ask-not", JFK, None, 3.15, 4.45, "Ask not.", "held_out"),
    ("jfk-ask-what-you-can-do", JFK, None, 8.05, 10.90, "Ask what you can do for your country.", "held_out"),
    ("hotwords", HOTWORDS, None, 0.0, 4.0, "Then you go into your ComfyUI folder again.", "held_out"),
    ("stereo-confused-complaint", STEREO, 0, 0.0, 1.6, "He began a confused complaint.", "tune"),
    ("stereo-horizon", STEREO, 1, 0.3, 2.7, "The horizon seems extremely distant.", "tune"),
]

# --- who says it ---------------------------------------------------------------------------------

# Kokoro voices of each language, other than the reply's; ``tune`` and ``held_out`` halves.
KOKORO = {
    "en": {"tune": ["af_bella", "am_michael", "bf_emma", "am_puck"],
           "held_out": ["af_nova", "am_echo", "bm_george", "af_sarah"]},
    "es": {"tune": ["ef_dora"], "held_out": ["em_alex"]},
    "fr": {"tune": ["ff_siwis"], "held_out": []},
    "it": {"tune": ["if_sara"], "held_out": ["im_nicola"]},
    "pt": {"tune": ["pf_dora"], "held_out": ["pm_alex"]},
    "hi": {"tune": ["hf_alpha"], "held_out": ["hm_omega"]},
}
# espeak-ng voices: (voice+variant, pitch 0-99, words per minute).
ESPEAK = {
    "en": {"tune": [("en-us+f3", 55, 170), ("en-gb+m3", 40, 150)],
           "held_out": [("en-029+f4", 70, 190), ("en-gb-scotland+m2", 30, 140), ("en-us+m7", 60, 220)]},
    "es": {"tune": [("es+f2", 55, 170)], "held_out": [("es-419+m3", 40, 160)]},
    "fr": {"tune": [("fr+m2", 45, 160)], "held_out": [("fr+f3", 65, 180)]},
    "it": {"tune": [("it+f2", 55, 170)], "held_out": [("it+m3", 40, 150)]},
    "pt": {"tune": [("pt-br+f3", 55, 170)], "held_out": [("pt+m2", 40, 150)]},
    "hi": {"tune": [("hi+f2", 55, 160)], "held_out": [("hi+m3", 40, 150)]},
}
NOISE_LEVELS = (None, 20.0, 10.0)  # SNR in dB; None: clean
# Echo paths: (delay ms, gain dB, RT60 s, split). Tuned on the corners, reported on the middle.
ECHO_PATHS = [(100, -10.0, 0.25, "tune"), (250, -25.0, 0.25, "tune"), (100, -25.0, 0.4, "tune"),
              (250, -10.0, 0.4, "tune"), (150, -15.0, 0.3, "held_out"), (200, -20.0, 0.35, "held_out"),
              (175, -12.0, 0.3, "held_out"), (125, -18.0, 0.4, "held_out")]
# The real interruption said on top of an echo: (voice, phrase) per echo path, in order.
ECHO_INTERRUPTIONS = [("kokoro:am_michael", "Wait."), ("espeak:en-us+f3:55:170", "Sorry, what?"),
                      ("kokoro:bf_emma", "Hold on."), ("kokoro:af_bella", "Stop."),
                      ("kokoro:am_echo", "Wait."), ("espeak:en-029+f4:70:190", "Sorry, what?"),
                      ("human:jfk-fellow-americans", "And so my fellow Americans."),
                      ("kokoro:bm_george", "No, I said Tuesday, not Thursday.")]


@dataclass(frozen=True)
class Case:
    """One thing said (or heard) over a playing reply.

    ``kind``: "backchannel", "non_speech", "interruption", "echo" or "echo_interruption";
    ``phrase``: the words said (or the sound's name, or "echo"); ``voice``:
    "kokoro:<voice>", "espeak:<voice>:<pitch>:<wpm>", "human:<cut>", "synthetic" or "package"
    ("" for echo alone); ``snr_db``: pink noise's SNR (None: clean); ``echo``: (delay ms, gain
    dB, RT60 s) of the reply's echo, or None; ``split``: "tune" or "held_out".
    """

    kind: str
    phrase: str
    voice: str
    language: str
    snr_db: float | None
    split: str
    echo: tuple | None = None

    @property
    def interrupts(self):
        """Whether the listener means to stop the reply."""
        return self.kind in ("interruption", "echo_interruption")

    @property
    def synthesiser(self):
        return self.voice.split(":")[0] if self.voice else "echo"

    @property
    def noise(self):
        return "clean" if self.snr_db is None else f"{self.snr_db:g} dB"

    @property
    def id(self):
        echo = "" if self.echo is None else "/echo-{}ms{:g}dB".format(*self.echo[:2])
        return f"{self.kind}/{self.language}/{self.phrase}/{self.voice or '-'}/{self.noise}{echo}"

    def seed(self):
        """A seed for this case's noise, the same in every run."""
        return int.from_bytes(hashlib.sha256(self.id.encode()).digest()[:4], "little")


def _voices(language, split):
    kokoro = [f"kokoro:{v}" for v in KOKORO[language][split]]
    espeak = [f"espeak:{v}:{p}:{s}" for v, p, s in ESPEAK[language][split]]
    return kokoro + espeak


def cases(languages=("en",)):
    """The corpus for ``languages`` (ISO 639-1 codes of the multilingual preset), in a fixed
    order. Each phrase and voice gets one noise level, in turn, so that every level has cases
    of every kind."""
    out = []
    turns = {"phrases": 0, "requests": 0}

    def noise(count="phrases"):
        turns[count] += 1
        return NOISE_LEVELS[turns[count] % len(NOISE_LEVELS)]

    for language in languages:
        for split in ("tune", "held_out"):
            for voice in _voices(language, split):
                for phrase in BACKCHANNELS[language]:
                    out.append(Case("backchannel", phrase, voice, language, noise(), split))
                for phrase in INTERRUPTIONS[language]:
                    out.append(Case("interruption", phrase, voice, language, noise(), split))
                for phrase in REQUESTS.get(language, ()):
                    out.append(Case("interruption", phrase, voice, language, noise("requests"), split))
                turns["requests"] += 1  # the next voice says each request at another level
        if language != "en":
            continue
        for sound in NON_SPEECH:
            for level in NOISE_LEVELS:
                split = "tune" if sound == "cough" else "held_out"
                out.append(Case("non_speech", sound, "package" if sound == "dtmf" else "synthetic", language,
                                level, split))
        for name, *_rest, said, split in HUMAN:
            for level in NOISE_LEVELS:
                out.append(Case("interruption", said, f"human:{name}", language, level, split))
        for (delay, gain, rt60, split), (voice, phrase) in zip(ECHO_PATHS, ECHO_INTERRUPTIONS, strict=True):
            out.append(Case("echo", "echo", "", language, None, split, (delay, gain, rt60)))
            out.append(Case("echo_interruption", phrase, voice, language, None, split, (delay, gain, rt60)))
    return out


# --- sound -------------------------------------------------------------------------------------

def pink_noise(samples, seed):
    """Pink (1/f power) noise, unit RMS: white noise shaped in the frequency domain."""
    rng = np.random.default_rng(seed)
    spectrum = np.fft.rfft(rng.standard_normal(samples))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
    noise = np.fft.irfft(spectrum, samples)
    return (noise / (np.sqrt(np.mean(noise ** 2)) + 1e-12)).astype(np.float32)


def active_rms(samples, rate=RATE):
    """RMS of the loud part of ``samples`` (20 ms frames within 30 dB of the loudest): the level
    of speech, not of its pauses."""
    frame = rate // 50
    frames = samples[: len(samples) // frame * frame].reshape(-1, frame)
    if not len(frames):
        return 0.0
    levels = np.sqrt(np.mean(frames ** 2, axis=1))
    loud = levels[levels > levels.max() * 10 ** (-30 / 20)]
    return float(np.sqrt(np.mean(loud ** 2))) if len(loud) else 0.0


def room(rt60_s, seed, rate=RATE):
    """A room's impulse response: the direct path, then exponentially decaying noise (-60 dB at
    ``rt60_s``), normalised to unit energy."""
    length = int(rt60_s * rate)
    rng = np.random.default_rng(seed)
    t = np.arange(length) / rate
    tail = rng.standard_normal(length) * 10 ** (-3 * t / rt60_s) * 0.3
    tail[0] = 1.0
    return (tail / np.sqrt(np.sum(tail ** 2))).astype(np.float32)


def cough(seed, rate=RATE):
    """A cough: two bursts of low-passed noise with a sharp attack, 0.35 s."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(0.35 * rate), np.float32)
    for start, length, level in ((0.0, 0.16, 1.0), (0.19, 0.12, 0.6)):
        n = int(length * rate)
        burst = np.convolve(rng.standard_normal(n), np.ones(6) / 6, "same")
        envelope = np.minimum(np.arange(n) / (0.01 * rate), 1) * np.exp(-np.arange(n) / (0.05 * rate))
        i = int(start * rate)
        out[i:i + n] += (burst * envelope * level).astype(np.float32)
    return 0.3 * out / np.abs(out).max()


def breath(seed, rate=RATE):
    """An audible breath in: band-limited noise under a slow swell, 0.6 s, quiet."""
    rng = np.random.default_rng(seed)
    n = int(0.6 * rate)
    noise = rng.standard_normal(n)
    smooth = np.convolve(noise, np.ones(3) / 3, "same") - np.convolve(noise, np.ones(40) / 40, "same")
    envelope = np.sin(np.linspace(0, np.pi, n)) ** 2
    out = (smooth * envelope).astype(np.float32)
    return 0.05 * out / np.abs(out).max()


def dtmf():
    """Two keypad tones as a phone records them (pipecat's DTMF files), with a gap."""
    from pool.backends.cache import package_dir

    folder = package_dir("pipecat") / "audio" / "dtmf"
    tones = [load_audio(folder / f"dtmf-{key}.wav") for key in ("5", "9")]
    return np.concatenate([tones[0], np.zeros(RATE // 10, np.float32), tones[1]])


def recording(path, channel=None):
    """A shared recording as float32 @ 24 kHz: one ``channel`` of it, or (None) the channels'
    mean (``realtime.client.load_audio``)."""
    if channel is None:
        return load_audio(path)
    samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    return soxr.resample(samples[:, channel], rate, RATE).astype(np.float32)


def espeak(text, voice, pitch, wpm, language):
    """``text`` spoken by espeak-ng (Debian's ``espeak-ng``): float32 @ 24 kHz. Raises
    RuntimeError when espeak-ng is not installed."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("The corpus's espeak-ng voices need Debian's espeak-ng: apt-get install espeak-ng")
    with tempfile.NamedTemporaryFile(suffix=".wav") as out:
        subprocess.run(["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(wpm), "-w", out.name, text],
                       check=True, capture_output=True)
        samples, rate = soundfile.read(out.name, dtype="float32")
    return soxr.resample(samples, rate, RATE).astype(np.float32)


class Renderer:
    """Renders cases. ``tts``: a Kokoro backend with ``synthesize(text, voice)`` (the server's
    ``pool.backends.tts.KokoroTTS``); ``cache_dir``: where rendered utterances are kept between
    runs (None: not kept)."""

    LEVEL = 0.1  # RMS of an utterance's active part: a close, normal voice

    def __init__(self, tts, cache_dir=None):
        self.tts = tts
        self.cache_dir = Path(cache_dir) if cache_dir else None

    def utterance(self, case):
        """The listener's part of ``case`` (no noise, no echo): float32 @ 24 kHz, speech at
        ``LEVEL``; empty for echo alone."""
        if case.kind == "echo":
            return np.zeros(0, np.float32)
        key = hashlib.sha256(f"{case.voice}|{case.phrase}|{case.language}".encode()).hexdigest()[:20]
        path = self.cache_dir / f"{key}.npy" if self.cache_dir else None
        if path is not None and path.exists():
            return np.load(path)
        samples = self._render(case)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, samples)
        return samples

    def _render(self, case):
        kind, _, rest = case.voice.partition(":")
        if kind == "kokoro":
            samples = self.tts.synthesize(case.phrase, rest)
        elif kind == "espeak":
            voice, pitch, wpm = rest.split(":")
            samples = espeak(case.phrase, voice, pitch, wpm, case.language)
        elif kind == "human":
            _, path, channel, start, end, _, _ = next(h for h in HUMAN if h[0] == rest)
            samples = recording(path, channel)[int(start * RATE):int(end * RATE)]
        elif case.phrase == "cough":
            return cough(case.seed())
        elif case.phrase == "breath":
            return breath(case.seed())
        elif case.phrase == "dtmf":
            return dtmf().astype(np.float32)
        else:
            raise ValueError(f"no way to render {case.id}")
        level = active_rms(samples)
        return (samples * (self.LEVEL / level if level else 1.0)).astype(np.float32)

    def noise(self, case, samples):
        """``samples`` of the case's pink noise at its SNR against the utterance's level (zeros
        for a clean case)."""
        if case.snr_db is None:
            return np.zeros(samples, np.float32)
        return pink_noise(samples, case.seed()) * self.LEVEL * 10 ** (-case.snr_db / 20)


def corpus_folder():
    """Where rendered utterances are cached between runs (outside the checkout's tracked files)."""
    return Path(tempfile.gettempdir()) / "s2s-interruption-corpus"

