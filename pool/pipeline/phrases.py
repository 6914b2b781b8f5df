"""Cutting streamed LLM text into speakable phrases (the LLM stage hands each to the TTS)."""

import re


class PhraseSplitter:
    """Cuts streamed LLM text into speakable phrases, the first ones as early as possible.

    A phrase ends at ``.!?;:`` followed by whitespace, at a comma once it has COMMA_WORDS words,
    or at MAX_WORDS words. Both limits grow with the phrase's position: the first phrase is a
    few words (its synthesis is the wait before the first audio), the second a little longer
    (it must be ready before the first has been heard), later ones whole sentences (better
    prosody). Concatenating every phrase returned gives back exactly the text pushed in.
    """

    COMMA_WORDS = (2, 4, 8)  # by phrase position; the last applies to every later phrase
    MAX_WORDS = (4, 8, 30)
    _END = re.compile(r"[.!?;:]+[\"')\]]*\s")
    _COMMA = re.compile(r",\s")
    _WORD = re.compile(r"\S+\s")

    def __init__(self):
        self._text = ""
        self._count = 0  # phrases returned so far

    def push(self, text):
        """Add streamed text; returns the phrases it completed (possibly none)."""
        self._text += text
        phrases = []
        while (cut := self._cut()) is not None:
            phrases.append(self._text[:cut])
            self._text = self._text[cut:]
            self._count += 1
        return phrases

    def flush(self):
        """The text not yet returned (the last phrase)."""
        rest, self._text = self._text, ""
        return rest

    def _cut(self):
        match = self._END.search(self._text)
        if match:
            return match.end() - 1
        position = min(self._count, len(self.MAX_WORDS) - 1)
        for comma in self._COMMA.finditer(self._text):
            if len(self._text[:comma.start()].split()) >= self.COMMA_WORDS[position]:
                return comma.end() - 1
        max_words = self.MAX_WORDS[position]
        words = list(self._WORD.finditer(self._text))
        if len(words) > max_words:  # one more word seen: the cut point is a real word boundary
            return words[max_words - 1].end() - 1
        return None
