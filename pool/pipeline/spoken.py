"""What the LLM writes, made speakable before the TTS: markdown, links, emoji, numbers.

An endpoint model writes for a screen: ``**bold**``, ``- lists``, ``# headings``, code, URLs and
emoji, which espeak-ng (Kokoro's phonemizer) reads out as "asterisk asterisk", "H T T P S colon
slash slash" and "grinning face". It reads plain numbers well in every language, but not
"$5.50" ("dollar five. fifty"), "2026-12-01" ("... dash twelve dash zero one") or "5 km" ("K M").

``SpokenText`` is streaming: ``push`` returns what can be said of the text so far, holding back
an unfinished word, a line start whose marker is not complete yet, or an open inline construct
(a link, code span or emphasis not closed yet, up to HOLD_CHARS). Markdown is removed and its
words kept: headings and list items become sentences, table cells are read in order, code keeps
its words; links are their text, URLs their domain ("example dot com"), e-mails "bob at example
dot com"; emoji are dropped. Numbers, times, dates, currencies, percentages and units after a
number are written as words with ``num2words`` in the reply's language where it has that
language (English, Spanish, French, Italian, Portuguese; others are left to espeak-ng, which
reads digits itself). The text the TTS is given is the transcript the client gets.
"""

import re
import unicodedata

from num2words import CONVERTER_CLASSES, num2words

HOLD_CHARS = 300  # an inline construct still open after this much text is said as it is

# Words per language: "dot", "at", "percent", "point" of a time, and months, for num2words' languages.
WORDS = {
    "en": {"minus": "minus", "dot": "dot", "at": "at", "percent": "percent",
           "months": ["January", "February", "March", "April", "May", "June", "July", "August", "September",
                      "October", "November", "December"]},
    "es": {"minus": "menos", "dot": "punto", "at": "arroba", "percent": "por ciento",
           "months": ["enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre",
                      "octubre", "noviembre", "diciembre"]},
    "fr": {"minus": "moins", "dot": "point", "at": "arobase", "percent": "pour cent",
           "months": ["janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre",
                      "octobre", "novembre", "décembre"]},
    "it": {"minus": "meno", "dot": "punto", "at": "chiocciola", "percent": "per cento",
           "months": ["gennaio", "febbraio", "marzo", "aprile", "maggio", "giugno", "luglio", "agosto",
                      "settembre", "ottobre", "novembre", "dicembre"]},
    "pt": {"minus": "menos", "dot": "ponto", "at": "arroba", "percent": "por cento",
           "months": ["janeiro", "fevereiro", "março", "abril", "maio", "junho", "julho", "agosto", "setembro",
                      "outubro", "novembro", "dezembro"]},
}
# Units after a number: English names (singular, plural); other languages keep the English
# table only where the word is the same, so they get their own short one.
UNITS = {
    "en": {"km": ("kilometre", "kilometres"), "m": ("metre", "metres"), "cm": ("centimetre", "centimetres"),
           "mm": ("millimetre", "millimetres"), "kg": ("kilogram", "kilograms"), "g": ("gram", "grams"),
           "mi": ("mile", "miles"), "ft": ("foot", "feet"), "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"),
           "mph": ("mile per hour", "miles per hour"), "km/h": ("kilometre per hour", "kilometres per hour"),
           "°C": ("degree Celsius", "degrees Celsius"), "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
           "ml": ("millilitre", "millilitres"), "l": ("litre", "litres"), "GB": ("gigabyte", "gigabytes"),
           "MB": ("megabyte", "megabytes")},
    "es": {"km": ("kilómetro", "kilómetros"), "m": ("metro", "metros"), "cm": ("centímetro", "centímetros"),
           "kg": ("kilo", "kilos"), "g": ("gramo", "gramos"), "km/h": ("kilómetro por hora", "kilómetros por hora"),
           "°C": ("grado", "grados")},
    "fr": {"km": ("kilomètre", "kilomètres"), "m": ("mètre", "mètres"), "cm": ("centimètre", "centimètres"),
           "kg": ("kilo", "kilos"), "g": ("gramme", "grammes"), "km/h": ("kilomètre heure", "kilomètres heure"),
           "°C": ("degré", "degrés")},
    "it": {"km": ("chilometro", "chilometri"), "m": ("metro", "metri"), "cm": ("centimetro", "centimetri"),
           "kg": ("chilo", "chili"), "g": ("grammo", "grammi"), "km/h": ("chilometro orario", "chilometri orari"),
           "°C": ("grado", "gradi")},
    "pt": {"km": ("quilómetro", "quilómetros"), "m": ("metro", "metros"), "cm": ("centímetro", "centímetros"),
           "kg": ("quilo", "quilos"), "g": ("grama", "gramas"), "km/h": ("quilómetro por hora", "quilómetros por hora"),
           "°C": ("grau", "graus")},
}
CURRENCIES = {"$": "USD", "US$": "USD", "R$": "BRL", "€": "EUR", "£": "GBP", "USD": "USD", "EUR": "EUR", "GBP": "GBP"}

_LINE_MARKER = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-*+•]\s+|\d{1,3}[.)]\s+|\[[ xX]\]\s+)+")
_FENCE = re.compile(r"^\s*(```|~~~)")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_IMAGE_OR_LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]*)[^)]*\)")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>()\"']+[^\s<>()\"'.,;:!?]")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_EMPHASIS = re.compile(r"(?<![\w*_~])(\*{1,3}|_{1,3}|~~)(?=\S)|(?<=\S)(\*{1,3}|_{1,3}|~~)(?![\w*_~])")
# Asterisks left in a word once emphasis is gone ("1**1", "2**8"): code's power, or markup the
# model left open; never a sound of speech. A single one between numbers may be "times".
_STARS = re.compile(r"\*{2,}")
_HTML = re.compile(r"</?[a-zA-Z][^>]*>")
_NUMBER = r"\d+(?:[.,]\d+)*"
_CURRENCY_BEFORE = re.compile(r"(US\$|R\$|[$€£])\s?(" + _NUMBER + r")")
_CURRENCY_AFTER = re.compile(r"(" + _NUMBER + r")\s?(€|USD|EUR|GBP)(?!\w)")
_TIME = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)(?:\s?([ap])\.?\s?m\b)?", re.IGNORECASE)
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_ORDINAL_EN = re.compile(r"\b(\d+)(st|nd|rd|th)\b")
_PERCENT = re.compile(r"(" + _NUMBER + r")\s?%")
_MINUS = re.compile(r"(?<![\w])[-−](?=\d)")
_ENDS_IN_NUMBER = re.compile(r"(?<!\S)(?:\S*\d|US\$|R\$|[$€£])$")
_BARE_MARKER = re.compile(r"^\s*(?:#{1,6}|>|[-*+•]|\d{1,3}[.)]|\[[ xX]\])$")
_PLAIN_NUMBER = re.compile(r"(?<![\w.,])(" + _NUMBER + r")(?![\w])")


def _units_pattern(language):
    names = sorted(UNITS.get(language, {}), key=len, reverse=True)
    if not names:
        return None
    return re.compile(r"(" + _NUMBER + r")\s?(" + "|".join(re.escape(n) for n in names) + r")(?![\w/])")


_UNIT_PATTERNS = {language: _units_pattern(language) for language in UNITS}


class SpokenText:
    """Streaming normaliser of one reply's text (``language``: ISO 639-1 of the voice speaking
    it; None or a language num2words lacks: markup only, digits left to espeak-ng).

    ``push(text) -> str`` returns the speakable text of what is complete so far; ``flush()`` the
    rest. Concatenating them is the whole reply as spoken.
    """

    def __init__(self, language="en"):
        self.language = language if language in WORDS else None
        self._words = WORDS.get(language, WORDS["en"])
        self._held = ""
        self._line = ""  # the current line so far (released part), to know where it started
        self._in_code = False
        self._said_any = False
        self._ends_in_space = False  # what was said last ended in a space

    def push(self, text):
        self._held = _EMOJI_RUN.sub("", self._held + text)
        cut = self._release_point()
        if cut <= 0:
            return ""
        ready, self._held = self._held[:cut], self._held[cut:]
        return self._speak(ready)

    def flush(self):
        rest, self._held = self._held, ""
        return self._speak(rest + "\n", final=True).rstrip() if rest.strip() or self._line.strip() else ""

    def _release_point(self):
        """How much of the held text can be said now: up to its last whitespace, less a line
        marker without its space, a number or currency sign at the end (a unit, "pm" or an amount
        may follow) and a table row not ended yet; up to its last line end while an inline
        construct is open. Anything held HOLD_CHARS long is said as it is."""
        held = self._held
        last_space = max(held.rfind(" "), held.rfind("\n"), held.rfind("\t"))
        if last_space < 0:
            return 0
        cut = last_space + 1
        line_start = held.rfind("\n", 0, cut) + 1
        if (line_start or not self._line) and _BARE_MARKER.match(held[line_start:cut]):
            cut = line_start  # "-" or "1." without its space yet: the line's start waits for it
        if len(held) < HOLD_CHARS:
            if held[line_start:].lstrip().startswith("|"):  # a table row is read once it is whole
                cut = line_start
            elif not _closed(held[:cut]):
                cut = held.rfind("\n", 0, cut) + 1
            else:  # "3:30" may go on "pm", "5" "km", "20" "%", "$" "5", "5,50" "€": hold them
                while number := _ENDS_IN_NUMBER.search(held[:cut].rstrip(" \t")):
                    cut = number.start()
        return cut

    def _speak(self, text, final=False):
        out = []
        lines = text.split("\n")
        for i, part in enumerate(lines):
            ends = i < len(lines) - 1
            line_start = not self._line
            self._line += part
            if ends:
                out.append(self._finish_line(part, line_start, final and i == len(lines) - 2))
                self._line = ""
            elif part:
                out.append(self._inline_part(part, line_start))
        spoken = re.sub(r"[ \t]{2,}", " ", "".join(out))
        if not self._said_any or self._ends_in_space:  # no space at the start, none doubled
            spoken = spoken.lstrip() if not self._said_any else spoken.lstrip(" \t")
        if spoken:
            self._said_any, self._ends_in_space = True, spoken[-1] in " \t"
        return spoken

    def _inline_part(self, part, line_start):
        """A piece of a line that goes on after it."""
        if self._in_code or _FENCE.match(self._line):
            return _code_words(part) if self._in_code else ""
        if line_start:
            part = _LINE_MARKER.sub("", part, count=1)
        return self._inline(self._cells(part, line_start))

    def _finish_line(self, part, line_start, last=False):
        """The rest of a line that ends here, and the pause its end makes (``last``: the reply's
        end, where a plain line needs no full stop: it may be a reply cut short)."""
        line = self._line
        if _FENCE.match(line):
            self._in_code = not self._in_code
            return ""
        if self._in_code:
            return _code_words(part) + " "
        if _TABLE_RULE.match(line):
            return ""
        if line_start:
            part = _LINE_MARKER.sub("", part, count=1)
        if line.lstrip().startswith("|"):
            part = re.sub(r"\s*\|\s*$", "", part)
        part = self._cells(part, line_start)
        spoken = self._inline(part).rstrip()
        whole = _LINE_MARKER.sub("", line.strip(), count=1)
        plain = whole == line.strip() and not line.lstrip().startswith("|")
        if whole and not (last and plain) and not re.search(r"[.!?:;,]['\")\]]*$", self._inline(whole).rstrip()):
            spoken += "."  # a heading, list item or table row ends as a sentence
        return spoken + " " if whole else spoken

    def _cells(self, part, line_start):
        """A table row's cells read in order, separated by commas."""
        if not self._line.lstrip().startswith("|"):
            return part
        if line_start:
            part = re.sub(r"^\s*\|\s*", "", part)
        return re.sub(r"[ \t]*\|[ \t]*", ", ", part)

    def _inline(self, text):
        text = _IMAGE_OR_LINK.sub(lambda m: m.group(1) or self._domain(m.group(2)), text)
        text = _HTML.sub(" ", text)
        text = _EMAIL.sub(lambda m: self._email(m.group()), text)
        text = _URL.sub(lambda m: self._domain(m.group()), text)
        text = text.replace("`", "")
        text = _STARS.sub(" ", _EMPHASIS.sub("", text))
        if self.language is not None:
            text = self._numbers(text)
        return _without_emoji(text)

    def _domain(self, url):
        host = re.sub(r"^(?:https?://)?(?:www\.)?", "", url).split("/")[0].split("?")[0]
        return f" {self._words['dot']} ".join(part for part in host.split(".") if part) or url

    def _email(self, address):
        user, _, host = address.partition("@")
        return f"{user.replace('.', ' ' + self._words['dot'] + ' ')} {self._words['at']} {self._domain(host)}"

    def _numbers(self, text):
        language = self.language
        text = _ISO_DATE.sub(lambda m: self._date(*map(int, m.groups())) or m.group(), text)
        text = _MINUS.sub(self._words["minus"] + " ", text)
        text = _TIME.sub(lambda m: self._time(int(m.group(1)), int(m.group(2)), m.group(3)), text)
        text = _CURRENCY_BEFORE.sub(lambda m: self._money(m.group(2), CURRENCIES[m.group(1)]), text)
        text = _CURRENCY_AFTER.sub(lambda m: self._money(m.group(1), CURRENCIES[m.group(2)]), text)
        text = _PERCENT.sub(lambda m: f"{self._number(m.group(1))} {self._words['percent']}", text)
        if language == "en":
            text = _ORDINAL_EN.sub(lambda m: num2words(int(m.group(1)), lang="en", to="ordinal"), text)
        units = _UNIT_PATTERNS.get(language)
        if units is not None:
            text = units.sub(lambda m: self._measure(m.group(1), m.group(2)), text)
        return _PLAIN_NUMBER.sub(lambda m: self._number(m.group(1), year=True), text)

    def _value(self, digits):
        """A written number as int or float: "1,234.5" in English, "1.234,5" elsewhere."""
        thousands, decimal = (",", ".") if self.language == "en" else (".", ",")
        if re.fullmatch(r"\d{1,3}(?:" + re.escape(thousands) + r"\d{3})+", digits):
            return int(digits.replace(thousands, ""))
        digits = digits.replace(decimal, ".") if decimal == "," else digits
        if re.fullmatch(r"\d+\.\d+", digits):
            return float(digits) if len(digits.split(".")[1]) <= 3 else None
        return int(digits) if digits.isdigit() else None

    def _number(self, digits, year=False):
        value = self._value(digits)
        if value is None:  # a version or a phone number: digit by digit
            return " ".join(num2words(int(d), lang=self.language) if d.isdigit() else self._words["dot"]
                            for d in digits if d.isdigit() or d in ".,")
        if year and self.language == "en" and isinstance(value, int) and 1100 <= value <= 2099 \
                and len(digits) == 4 and value % 1000 >= 10:
            return num2words(value, lang="en", to="year")
        return num2words(value, lang=self.language)

    def _money(self, digits, currency):
        value = self._value(digits)
        if value is None:
            return digits
        forms = getattr(CONVERTER_CLASSES[self.language], "CURRENCY_FORMS", {}).get(currency)
        if forms is None:  # a currency num2words has no words for in this language: its code
            return f"{num2words(value, lang=self.language)} {currency}"
        if value == int(value):  # num2words would add "zero cents"
            return f"{num2words(int(value), lang=self.language)} {forms[0][0 if value == 1 else 1]}"
        return num2words(float(value), lang=self.language, to="currency", currency=currency)

    def _measure(self, digits, unit):
        value = self._value(digits)
        singular, plural = UNITS[self.language][unit]
        return f"{self._number(digits)} {singular if value == 1 else plural}"

    def _time(self, hours, minutes, meridiem):
        language = self.language
        if language == "en":
            said = num2words(hours, lang="en")
            if minutes == 0:
                said += "" if meridiem else " o'clock"
            else:
                said += (" oh " if minutes < 10 else " ") + num2words(minutes, lang="en")
            return said + (f" {meridiem.lower()} m" if meridiem else "")
        said = num2words(hours, lang=language)
        return said if minutes == 0 else f"{said} {num2words(minutes, lang=language)}"

    def _date(self, year, month, day):
        if not (1 <= month <= 12 and 1 <= day <= 31):
            return None
        month_name = self._words["months"][month - 1]
        if self.language == "en":
            return f"{month_name} {num2words(day, lang='en', to='ordinal')}, {num2words(year, lang='en', to='year')}"
        joiner = {"es": "de", "pt": "de"}.get(self.language)
        day_words = num2words(day, lang=self.language, to="ordinal") if day == 1 and self.language == "fr" \
            else num2words(day, lang=self.language)
        year_words = num2words(year, lang=self.language)
        if joiner:
            return f"{day_words} {joiner} {month_name} {joiner} {year_words}"
        return f"{day_words} {month_name} {year_words}"


def _closed(text):
    """Whether ``text`` holds no inline construct still open: a code span, a link, emphasis."""
    if text.count("`") % 2 or text.count("[") > text.count("]"):
        return False
    if "](" in text and text.rfind("](") > text.rfind(")"):
        return False
    return text.count("**") % 2 == 0 and text.count("__") % 2 == 0 and text.count("~~") % 2 == 0


def _code_words(line):
    """A line of code, as words: its symbols dropped."""
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", line))


_EMOJI_RUN = re.compile(r"[ \t]*(?:[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\u200d\ufe0f\ufe0e])+")


def _without_emoji(text):
    """``text`` without emoji and pictographs (Unicode "So" symbols, their joiners and modifiers)."""
    kept = "".join(c for c in text if unicodedata.category(c) not in ("So", "Sk", "Cs") or c in "°^`"
                   if c not in "\u200d\ufe0f\ufe0e")
    return re.sub(r"[ \t]+([.,!?;:])", r"\1", re.sub(r"[ \t]{2,}", " ", kept)) if kept != text else kept
