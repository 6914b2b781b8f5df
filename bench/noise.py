"""noise_reduction: what RNNoise costs, and what it changes on a noisy recording.

    python -m bench.noise [--seconds 10]

Noise the server did not make is mixed into jfk.flac (white noise, and brown noise: white noise
integrated, most of its power low, as a fan or traffic) at 5 dB and 0 dB SNR. For each mix, with
and without RNNoise (``pool.backends.denoise``), as the VAD stage runs it:

- cost: seconds of denoising (resampling included) per second of audio, on one thread;
- VAD false starts: speech starts Silero finds in ``--seconds`` of the noise alone (a start:
  160 ms of windows at or above 0.5, the VAD stage's MIN_SPEECH_MS), and the windows it calls
  speech there;
- word errors: Whisper tiny.en's word error rate on the mix, against jfk.flac's reference.
"""

import argparse
import time

import numpy as np
import soxr

from realtime.client import load_audio

from .common import RECORDINGS, emit

REFERENCE = ("and so my fellow americans ask not what your country can do for you "
             "ask what you can do for your country")
RATE = 16_000


def noises(samples_count, seed=0):
    rng = np.random.default_rng(seed)
    white = rng.standard_normal(samples_count)
    brown = np.cumsum(rng.standard_normal(samples_count))
    brown -= np.convolve(brown, np.ones(801) / 801, mode="same")  # no drift: what a microphone passes
    return {"white": white, "brown": brown}


def at_snr(speech, noise, snr_db):
    gain = np.sqrt(np.mean(speech ** 2) / (np.mean(noise ** 2) * 10 ** (snr_db / 10)))
    return (noise * gain).astype(np.float32)


def word_errors(said, reference=REFERENCE):
    """Word error rate: word-level edit distance over the reference's words."""
    from tests.helpers import normalise

    hyp, ref = normalise(said).split(), reference.split()
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1] / len(ref)


def vad_starts(vad, audio, window=512, threshold=0.5, min_windows=5):
    """Speech starts and speech windows Silero finds in ``audio`` (16 kHz)."""
    stream = vad.new_stream()
    run = starts = voiced = 0
    for start in range(0, len(audio) - window + 1, window):
        speech = stream.probability(audio[start:start + window]) >= threshold
        voiced += speech
        run = run + 1 if speech else 0
        starts += run == min_windows
    return starts, voiced


def denoised(denoiser, audio):
    stream = denoiser.new_stream()
    started = time.perf_counter()
    out = np.concatenate([stream.process(piece) for piece in np.array_split(audio, max(1, len(audio) // 640))])
    return out, (time.perf_counter() - started) / (len(audio) / RATE)


def run(seconds):
    """The measurements, as a dict (``seconds`` of noise alone for the false starts)."""
    from pool.backends.cache import default_paths
    from pool.backends.denoise import RNNoise
    from pool.backends.stt import WhisperSTT
    from pool.backends.vad import SileroVAD
    from pool.conf import DEFAULTS

    paths = default_paths(DEFAULTS["MODEL_CACHE_DIR"])
    vad, stt, denoiser = SileroVAD(paths["vad"]), WhisperSTT(paths["stt"]), RNNoise()
    speech = soxr.resample(load_audio(RECORDINGS["jfk"]), 24_000, RATE).astype(np.float32)
    rows, costs = [], []
    for kind, noise in noises(len(speech) + int(seconds * RATE)).items():
        for snr in (5, 0):
            scaled = at_snr(speech, noise, snr)
            mix, alone = speech + scaled[:len(speech)], scaled[len(speech):]
            clean_mix, cost = denoised(denoiser, mix)
            clean_alone, _ = denoised(denoiser, alone)
            costs.append(cost)
            for label, heard, quiet in (("off", mix, alone), ("rnnoise", clean_mix, clean_alone)):
                starts, voiced = vad_starts(vad, quiet)
                rows.append({"noise": kind, "snr_db": snr, "noise_reduction": label,
                             "vad_false_starts": starts, "vad_speech_windows": voiced,
                             "word_error_rate": round(word_errors(stt.transcribe(heard, "en")), 3)})
    clean = round(word_errors(stt.transcribe(speech, "en")), 3)
    return {"clean_word_error_rate": clean, "seconds_of_noise_alone": seconds,
            "denoise_seconds_per_audio_second": round(float(np.mean(costs)), 4), "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="of noise alone, for the false starts")
    args = parser.parse_args(argv)
    emit("noise", run(args.seconds))


if __name__ == "__main__":
    main()
