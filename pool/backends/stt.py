"""Speech to text with faster-whisper (CTranslate2), one shared model for all units."""

from faster_whisper import WhisperModel


class WhisperSTT:
    """``model_path``: a CTranslate2 Whisper folder; ``threads``: CTranslate2 CPU threads.

    One model serves all units: CTranslate2 queues concurrent calls on its workers
    (``num_workers=1``), so two sessions transcribing at once take turns instead of
    oversubscribing the cores.
    """

    def __init__(self, model_path, threads=2):
        self.model = WhisperModel(str(model_path), device="cpu", compute_type="int8",
                                  cpu_threads=threads, num_workers=1)

    def transcribe(self, audio, language=None, prompt=None):
        """Transcript of ``audio`` (float32 mono, 16 kHz). ``language``: ISO code or None;
        ``prompt``: Whisper's initial prompt (text it expects, spelled as it should write it)."""
        segments, _info = self.model.transcribe(
            audio, language=language, beam_size=1, vad_filter=False,
            condition_on_previous_text=False, without_timestamps=True, initial_prompt=prompt,
        )
        return " ".join(segment.text.strip() for segment in segments).strip()
