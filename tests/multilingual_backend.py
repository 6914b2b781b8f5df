"""A test backend for the multilingual preset: the real default models (Silero, Whisper base,
Kokoro with the multilingual voices, Smart Turn) with a scripted test LLM that answers in the
language its instructions name, as a multilingual LLM would. ``S2S["BACKEND"] =
"tests.multilingual_backend.load"``."""

import dataclasses
import re

from pool.backends import load_default

REPLIES = {  # what the scripted LLM says, by the language the instructions name
    # Long enough for Whisper base to tell the language of the reply it hears back: a short
    # "Hola." spoken in pieces was once heard as Italian.
    "Spanish": "Buenos días. Hoy en Madrid hace sol, y la temperatura es muy agradable para pasear por la ciudad.",
    "French": "Bonjour. Il fait beau à Paris aujourd'hui, avec un peu de vent, et il fera plus chaud demain.",
    "English": "Hello. It is sunny today, with a light wind.",
}


class LanguageLLM:
    """Scripted test LLM: replies ``REPLIES[language]`` for the "Answer in <language>." that the
    session adds to the instructions (English when there is none)."""

    resumes = False

    def generate(self, request, on_text, should_stop, on_function_call=None):
        said = re.search(r"Answer in (\w+)\.", request.messages[0]["content"])
        reply = REPLIES.get(said.group(1) if said else "English", REPLIES["English"])
        sent = 0
        for word in re.findall(r"\s*\S+", reply):
            if should_stop():
                break
            on_text(word)
            sent += 1
        return {"input_tokens": len(request.messages), "output_tokens": sent}


def load(config):
    return dataclasses.replace(load_default(config), llm=LanguageLLM())
