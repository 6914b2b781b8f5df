"""Speech to text with faster-whisper (CTranslate2), one shared model for all units.

faster-whisper pads every input to Whisper's 30 s window before encoding, so a 2 s turn costs as
much as a 30 s one. A turn here is short, so ``WhisperSTT`` encodes a window just long enough for
it (``encoder_frames``) and decodes greedily with CTranslate2, using faster-whisper's own feature
extractor, tokenizer and prompt layout. Measured on tiny.en (BENCHMARKS.md §1a, and
the team's model notes that docs/MODELS.md summarises): 0.26-0.35 s -> 0.07-0.17 s a turn, word error rate 5.7 % -> 6.3 % on 80
utterances. Audio over ``SHORT_WINDOW_MAX_SECONDS`` takes faster-whisper's ordinary 30 s path.
"""

import math
import time
from pathlib import Path

import ctranslate2
import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import get_suppressed_tokens

from pool.backends.base import SPEECH_RATE

FRAMES_PER_SECOND = 100  # Whisper's log-mel hop is 10 ms
FULL_WINDOW_FRAMES = 3000  # Whisper's 30 s window
# A window within about 1 s of the audio makes Whisper repeat itself; 4 s of margin and a 10 s
# floor did not, on 80 utterances (the team's model notes, "Faster stages"). A peek may go
# without the floor where this CPU encodes it too slowly (WhisperSTT's peek_floor).
MIN_WINDOW_SECONDS, WINDOW_MARGIN_SECONDS = 10, 4
# Without the floor a peek's likeness reads lower: at -2.0 it separated the interruption corpus's
# tune peeks as the floor did at -1.8 (BENCHMARKS.md 14g). hear() adds this back, so that one
# BACKCHANNEL_LIKENESS serves both windows.
NO_FLOOR_LIKENESS_SHIFT = 0.2
SHORT_WINDOW_MAX_SECONDS = 26.0
# Decoded tokens allowed per second of audio (fast speech is ~4 tokens/s): a bound on any loop.
TOKENS_PER_SECOND, MIN_TOKENS = 8, 16
# faster-whisper's defaults for dropping a window that holds no speech (a cough, a click).
NO_SPEECH_THRESHOLD, LOG_PROB_THRESHOLD = 0.6, -1.0
# hear(): a backchannel phrase whose first token is this far (natural log) below the transcript's
# first token is not what was said. On the corpus's tune part, backchannels scored 0 to -3.5
# (laughter lowest), interruptions -4.7 to -8.6.
FIRST_TOKEN_GAP = 4.0


def encoder_frames(seconds, floor=MIN_WINDOW_SECONDS):
    """Log-mel frames to encode for ``seconds`` of audio: max(``floor``, audio + 4 s) seconds'
    worth, at most 30 s (3000 frames)."""
    window = max(floor, math.ceil(seconds + WINDOW_MARGIN_SECONDS))
    return min(FULL_WINDOW_FRAMES, FRAMES_PER_SECOND * window)


class WhisperSTT:
    """``model_path``: a CTranslate2 Whisper folder; ``threads``: CTranslate2 CPU threads;
    ``name``: the model's name (``pool.backends.cache.STT_NAMES``; else the folder's);
    ``peek_floor``: the least encoder window of a peek (``hear``), seconds: MIN_WINDOW_SECONDS, or
    0 where this CPU encodes that window too slowly for a peek (``cache.peek_window_floor``).

    One model serves all units: CTranslate2 queues concurrent calls on its workers
    (``num_workers=1``), so two sessions transcribing at once take turns instead of
    oversubscribing the cores.
    """

    def __init__(self, model_path, threads=2, name=None, peek_floor=MIN_WINDOW_SECONDS):
        self.name = name or Path(model_path).name
        self.peek_floor = peek_floor
        self.model = WhisperModel(str(model_path), device="cpu", compute_type="int8",
                                  cpu_threads=threads, num_workers=1)
        self._tokenizers = {}  # language -> faster_whisper Tokenizer
        # ISO 639-1 codes this model transcribes: ["en"] for the .en models.
        self.languages = frozenset(self.model.supported_languages)

    def transcribe(self, audio, language=None, prompt=None):
        """Transcript of ``audio`` (float32 mono, 16 kHz). ``language``: ISO code or None;
        ``prompt``: Whisper's initial prompt (text it expects, spelled as it should write it)."""
        return self.transcribe_detect(audio, language, prompt)[0]

    def transcribe_detect(self, audio, language=None, prompt=None):
        """``(transcript, language)``: ``language`` as given, else the one a multilingual model
        detects in this audio (Whisper's language token, from the same encoding), else the only
        one an English-only model knows."""
        return self.transcribe_batch([(audio, language, prompt)])[0]

    def transcribe_batch(self, turns):
        """``transcribe_detect`` of several turns at once: ``turns`` is a list of ``(audio,
        language, prompt)``; returns their ``(transcript, language)`` in order. Turns of one
        encoder window (``encoder_frames``: every turn up to 6 s has the 10 s floor's) are encoded
        as one batch and decoded greedily together, one decode per prompt length (CTranslate2
        wants <|startoftranscript|> at one position in a batch): each gets the transcript it
        would get alone (a runaway decode is cut at the longest turn's bound), four 4-5 s turns
        in 0.74-0.84x the time of one after the other (BENCHMARKS.md 5g). A turn of another window is
        encoded apart (padded to a longer one, its words could change); audio over
        SHORT_WINDOW_MAX_SECONDS takes faster-whisper's 30 s path, alone."""
        results = [None] * len(turns)
        windows = {}  # encoder frames -> indexes of turns
        for i, (audio, language, prompt) in enumerate(turns):
            if len(audio) / SPEECH_RATE > SHORT_WINDOW_MAX_SECONDS:
                results[i] = self._transcribe_30s(audio, language, prompt)
            else:
                windows.setdefault(encoder_frames(len(audio) / SPEECH_RATE), []).append(i)
        for indexes in windows.values():
            encoded, languages, _frames = self._encode_batch([turns[i][0] for i in indexes],
                                                             [turns[i][1] for i in indexes])
            prompts = {}  # prompt length -> [(position in indexes, tokenizer, prompt tokens)]
            for k, (i, language) in enumerate(zip(indexes, languages, strict=True)):
                tokenizer = self._tokenizer(language)
                tokens = self._prompt(tokenizer, turns[i][2])
                prompts.setdefault(len(tokens), []).append((k, tokenizer, tokens))
            for group in prompts.values():
                positions = [k for k, _, _ in group]
                subset = encoded if len(positions) == len(indexes) else ctranslate2.StorageView.from_array(
                    np.asarray(encoded)[positions])
                seconds = max(len(turns[indexes[k]][0]) for k in positions) / SPEECH_RATE
                decoded = self._generate(subset, [tokens for _, _, tokens in group], group[0][1], seconds)
                for (k, tokenizer, _), result in zip(group, decoded, strict=True):
                    results[indexes[k]] = self._text(result, tokenizer)[0], languages[k]
        return results

    def _tokenizer(self, language):
        multilingual = self.model.model.is_multilingual
        key = (language or "en") if multilingual else None
        if key not in self._tokenizers:
            self._tokenizers[key] = Tokenizer(self.model.hf_tokenizer, multilingual,
                                              task="transcribe", language=key)
        return self._tokenizers[key]

    def hear(self, audio, language=None, prompt=None, phrases=()):
        """A peek at speech over the assistant: ``(transcript, likeness)``. ``likeness``: how
        much more likely Whisper finds the most likely of ``phrases`` (a listener's "Mm-hmm.",
        "Yeah.", ...) as what was said than its own transcript: 0 when the audio is one of them
        however Whisper spelled it ("And I'm home." for "Mm-hmm."), -2 and lower for other words;
        None when nothing was heard or no ``phrases`` were given.

        Two steps, so that it costs little more than the transcript. The first token: the
        log-probability of each phrase's first token at the transcript's first step, against the
        transcript's own first token; a phrase more than FIRST_TOKEN_GAP below it is out, and when
        all are, that gap is the likeness ("Wait." scores about -7 against every backchannel).
        Then the phrases left and the transcript are forced through the decoder on the same
        encoding (CTranslate2's ``align``): the likeness is the best phrase's mean token
        log-probability minus the transcript's ("I see." against "I said Tuesday" fails at
        "see"). Measured on the interruption corpus (bench.interruptions, BENCHMARKS.md 14); a
        peek without the window floor adds NO_FLOOR_LIKENESS_SHIFT."""
        encoded, frames, language = self._encode(audio, language, floor=self.peek_floor)
        tokenizer = self._tokenizer(language)
        text, tokens, first = self._decode(encoded, len(audio) / SPEECH_RATE, tokenizer, prompt, bool(phrases))
        if not text or not phrases:
            return text, None
        forced = [tokenizer.encode(" " + phrase.strip()) for phrase in phrases]
        gaps = [float(first[f[0]] - first[tokens[0]]) for f in forced]
        kept = [f for f, gap in zip(forced, gaps, strict=True) if gap >= -FIRST_TOKEN_GAP]
        shift = NO_FLOOR_LIKENESS_SHIFT if self.peek_floor < MIN_WINDOW_SECONDS else 0.0
        if not kept:
            return text, round(max(gaps) + shift, 3)
        batch = ctranslate2.StorageView.from_array(np.repeat(np.asarray(encoded), len(kept) + 1, axis=0))
        start = list(tokenizer.sot_sequence) + [tokenizer.no_timestamps]
        aligned = self.model.model.align(batch, start, [*kept, tokens], [frames] * (len(kept) + 1))
        scores = [float(np.mean(np.log(np.maximum(a.text_token_probs, 1e-9)))) if len(a.text_token_probs) else -20.0
                  for a in aligned]
        return text, round(max(scores[:-1]) - scores[-1] + shift, 3)

    def _encode(self, audio, language, floor=MIN_WINDOW_SECONDS):
        """``(Whisper's encoding of audio, its log-mel frames, language)``: a window just longer
        than the audio (``floor``: its least length, seconds); ``language`` as given, else
        detected (multilingual), else "en"."""
        encoded, languages, frames = self._encode_batch([audio], [language], floor)
        return encoded, frames[0], languages[0]

    def _encode_batch(self, audios, languages, floor=MIN_WINDOW_SECONDS):
        """``(Whisper's encoding of each audio as one batch, each one's language, each one's
        log-mel frames)``: every window as long as the longest audio's (``encoder_frames``;
        ``floor``: its least length, seconds); a language as given, else detected
        (multilingual), else "en"."""
        frames = encoder_frames(max(len(audio) for audio in audios) / SPEECH_RATE, floor)
        features, used = [], []
        for audio in audios:
            feature = self.model.feature_extractor(audio)[:, :frames]
            used.append(max(1, feature.shape[1]))
            features.append(np.pad(feature, ((0, 0), (0, frames - feature.shape[1]))))
        encoded = self.model.model.encode(ctranslate2.StorageView.from_array(np.stack(features)))
        if not self.model.model.is_multilingual:
            return encoded, ["en"] * len(audios), used
        if any(language is None for language in languages):  # [[("<|es|>", p), ...], ...]: the most probable first
            detected = [found[0][0][2:-2] for found in self.model.model.detect_language(encoded)]
            languages = [language or heard for language, heard in zip(languages, detected, strict=True)]
        return encoded, list(languages), used

    def encode_seconds(self, audio, floor):
        """Seconds this CPU takes to encode ``audio`` (float32 mono, 16 kHz) in the window of
        ``floor`` (``encoder_frames``), English: what a peek's window costs."""
        started = time.perf_counter()
        self._encode(audio, "en", floor)
        return time.perf_counter() - started

    def _decode(self, encoded, seconds, tokenizer, prompt, first_step=False):
        """``(transcript, its tokens, log-probabilities of the vocabulary at its first step or
        None)``, greedy (``first_step``: with those log-probabilities); ``("", [], ...)`` for
        silence and no-speech."""
        result = self._generate(encoded, [self._prompt(tokenizer, prompt)], tokenizer, seconds, first_step)[0]
        tokens = result.sequences_ids[0]
        first = None
        if first_step and tokens:
            logits = np.asarray(result.logits[0][0], dtype=np.float64)
            first = logits - logits.max() - np.log(np.sum(np.exp(logits - logits.max())))
        text, tokens = self._text(result, tokenizer)
        return text, tokens, first

    def _generate(self, encoded, prompts, tokenizer, seconds, first_step=False):
        """CTranslate2's greedy decode of a batch (``encoded``, one prompt each, all of one
        length), at most the tokens ``seconds`` of speech could hold."""
        return self.model.model.generate(
            encoded, prompts, beam_size=1,
            max_length=int(MIN_TOKENS + TOKENS_PER_SECOND * seconds), return_scores=True,
            return_no_speech_prob=True, suppress_blank=True, return_logits_vocab=first_step,
            suppress_tokens=get_suppressed_tokens(tokenizer, [-1]),
        )

    @staticmethod
    def _text(result, tokenizer):
        """``(transcript, its tokens)`` of one decoded result; ``("", [])`` for silence and
        no-speech."""
        tokens = result.sequences_ids[0]
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)  # as faster-whisper
        if result.no_speech_prob > NO_SPEECH_THRESHOLD and avg_logprob < LOG_PROB_THRESHOLD:
            return "", []
        text = tokenizer.decode(tokens).strip()
        return (text, tokens) if any(c.isalnum() for c in text) else ("", [])  # "." is Whisper's silence

    def _prompt(self, tokenizer, prompt):
        """faster-whisper's prompt layout: previous text after <|startofprev|>, then the start
        sequence, then <|notimestamps|>."""
        tokens = []
        if prompt:
            tokens = [tokenizer.sot_prev] + tokenizer.encode(" " + prompt.strip())[-(self.model.max_length // 2 - 1):]
        return tokens + list(tokenizer.sot_sequence) + [tokenizer.no_timestamps]

    def _transcribe_30s(self, audio, language, prompt):
        segments, info = self.model.transcribe(
            audio, language=language, beam_size=1, vad_filter=False,
            condition_on_previous_text=False, without_timestamps=True, initial_prompt=prompt,
        )
        return " ".join(segment.text.strip() for segment in segments).strip(), info.language
