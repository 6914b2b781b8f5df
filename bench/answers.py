"""Answers worth hearing: 40 fixed questions with the words a right answer must contain, asked of
a live server as a client would (text items, spoken replies), scored automatically per group:
everyday knowledge, arithmetic, following instructions, remembering an earlier turn, and tool use
(a function tool the model must call with the right arguments, then answer from its output).

    python -m bench.answers [--compare-voice-style] [--compare-tool-calls]
                            [--llm-model PATH.gguf | --llm-base-url URL | --endpoint-gguf PATH.gguf]

Per group: accuracy, median spoken words (the reply's audio transcript), first audio (ms from
``response.create`` to the first ``response.output_audio.delta``). ``--compare-voice-style``
runs every case twice in one run, with the server's voice-style text (``VOICE_STYLE``) and
without it. ``--compare-tool-calls`` runs the tool group again with the other way of offering
tools to a GGUF (``LLM_TOOL_CALLS`` native and prompt). ``--endpoint-gguf`` serves a GGUF with
llama.cpp's own server in a process of its own on loopback and measures the server through
``LLM_BASE_URL`` (the endpoint path).
"""

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import time

import websockets

from .common import emit, llama_endpoint, start_server, stats

INSTRUCTIONS = "Answer in one or two short sentences."


def anyof(*words):
    """Right when the reply holds one of ``words`` (whole words, any case)."""
    return lambda reply: any(re.search(rf"\b{re.escape(w)}\b", reply, re.IGNORECASE) for w in words)


def short(check, words):
    """Right when ``check`` holds and the reply has at most ``words`` words."""
    return lambda reply: check(reply) and len(reply.split()) <= words


def starts(word):
    return lambda reply: re.match(rf"\W*{word}\b", reply, re.IGNORECASE) is not None


def in_order(*words):
    return lambda reply: re.search(r"\W+".join(rf"\b{w}\b" for w in words), reply, re.IGNORECASE) is not None


def spelled(word):
    """Right when the reply says the letters one by one ("C, A, T" or "C-A-T")."""
    return lambda reply: re.search(r"\b" + r"\W+".join(word) + r"\b", reply, re.IGNORECASE) is not None


def colours(n):
    names = ("red", "blue", "green", "yellow", "orange", "purple", "pink", "black", "white", "brown", "grey", "gray")
    return lambda reply: sum(bool(re.search(rf"\b{c}\b", reply, re.IGNORECASE)) for c in names) >= n


# (group, the user's turns (the last one is scored), check)
CASES = [
    ("knowledge", ["Which animal says moo?"], anyof("cow", "cows")),
    ("knowledge", ["Which planet do we live on?"], anyof("earth")),
    ("knowledge", ["What is the capital of France?"], anyof("paris")),
    ("knowledge", ["What colour is the sky on a clear day?"], anyof("blue")),
    ("knowledge", ["How many legs does a spider have?"], anyof("eight", "8")),
    ("knowledge", ["What do bees make?"], anyof("honey")),
    ("knowledge", ["What is frozen water called?"], anyof("ice")),
    ("knowledge", ["Which is the largest ocean on Earth?"], anyof("pacific")),
    ("knowledge", ["Who wrote Romeo and Juliet?"], anyof("shakespeare")),
    ("knowledge", ["How many days are there in a week?"], anyof("seven", "7")),
    ("knowledge", ["What is the opposite of hot?"], anyof("cold")),
    ("knowledge", ["What do cows drink?"], anyof("water")),
    ("arithmetic", ["What is two plus two?"], anyof("four", "4")),
    ("arithmetic", ["What is ten minus three?"], anyof("seven", "7")),
    ("arithmetic", ["What is three times four?"], anyof("twelve", "12")),
    ("arithmetic", ["What is half of ten?"], anyof("five", "5")),
    ("arithmetic", ["What is nine plus one?"], anyof("ten", "10")),
    ("arithmetic", ["What is six times seven?"], anyof("forty-two", "forty two", "42")),
    ("arithmetic", ["What is one hundred divided by four?"], anyof("twenty-five", "twenty five", "25")),
    ("arithmetic", ["What is fifteen plus five?"], anyof("twenty", "20")),
    ("instructions", ["Answer yes or no: is the sun hot?"], starts("yes")),
    ("instructions", ["Answer yes or no: can fish fly?"], starts("no")),
    ("instructions", ["Spell the word cat."], spelled("cat")),
    ("instructions", ["Say only the word hello."], short(anyof("hello"), 3)),
    ("instructions", ["Name three colours."], colours(3)),
    ("instructions", ["Answer in one word: what colour is grass?"], short(anyof("green"), 3)),
    ("instructions", ["Count from one to five."], in_order("one", "two", "three", "four", "five")),
    ("instructions", ["Reply with a number only: how many wheels does a bicycle have?"], short(anyof("two", "2"), 3)),
    ("memory", ["My favourite colour is green.", "What is my favourite colour?"], anyof("green")),
    ("memory", ["My name is Alice.", "What is my name?"], anyof("alice")),
    ("memory", ["I live in Madrid.", "Which city do I live in?"], anyof("madrid")),
    ("memory", ["My dog is called Rex.", "What is my dog called?"], anyof("rex")),
    ("memory", ["I am thirty years old.", "How old am I?"], anyof("thirty", "30")),
    ("memory", ["I like pizza more than anything.", "Which food do I like?"], anyof("pizza")),
]

TOOLS = [
    {"type": "function", "name": "get_weather", "description": "The weather forecast for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "function", "name": "set_timer", "description": "Start a timer.",
     "parameters": {"type": "object", "properties": {"minutes": {"type": "number"}}, "required": ["minutes"]}},
    {"type": "function", "name": "add_to_shopping_list", "description": "Add an item to the shopping list.",
     "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}},
]
# (question, the call it must make: name and (argument, a check of its value)), the tool's
# output, and the words the answer must then hold
TOOL_CASES = [
    ("What's the weather in Paris?", ("get_weather", "city", lambda v: "paris" in str(v).lower()),
     {"forecast": "sunny", "temperature_c": 21}, anyof("sunny", "21", "twenty-one", "twenty one")),
    ("What is the weather like in Tokyo today?", ("get_weather", "city", lambda v: "tokyo" in str(v).lower()),
     {"forecast": "rain", "temperature_c": 14}, anyof("rain", "rainy", "14", "fourteen")),
    ("Set a timer for five minutes.", ("set_timer", "minutes", lambda v: str(v).strip() in ("5", "5.0", "five")),
     {"timer": "started", "minutes": 5}, anyof("five", "5", "timer", "set", "started")),
    ("Set a timer for ten minutes please.", ("set_timer", "minutes", lambda v: str(v).strip() in ("10", "10.0", "ten")),
     {"timer": "started", "minutes": 10}, anyof("ten", "10", "timer", "set", "started")),
    ("Add milk to my shopping list.", ("add_to_shopping_list", "item", lambda v: "milk" in str(v).lower()),
     {"added": "milk"}, anyof("milk", "added")),
    ("Please put eggs on my shopping list.", ("add_to_shopping_list", "item", lambda v: "egg" in str(v).lower()),
     {"added": "eggs"}, anyof("eggs", "egg", "added")),
]


class Session:
    """One realtime session over a WebSocket, spoken replies, text input."""

    def __init__(self, ws):
        self.ws = ws

    async def send(self, event):
        await self.ws.send(json.dumps(event))

    async def until(self, kind, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            event = json.loads(await asyncio.wait_for(self.ws.recv(), deadline - time.monotonic()))
            if event["type"] == kind:
                return event
            self.seen.append((time.perf_counter(), event))

    async def say(self, text):
        await self.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
        await self.until("conversation.item.done")

    async def respond(self):
        """(transcript, first audio ms, function calls) of one response."""
        self.seen = []
        asked = time.perf_counter()
        await self.send({"type": "response.create"})
        done = await self.until("response.done")
        first = next((t for t, e in self.seen if e["type"] == "response.output_audio.delta"), None)
        transcript = "".join(e["delta"] for _, e in self.seen if e["type"] == "response.output_audio_transcript.delta")
        calls = [item for item in done["response"]["output"] if item["type"] == "function_call"]
        return transcript.strip(), None if first is None else (first - asked) * 1000, calls


async def ask(url, case, tools=False):
    async with websockets.connect(url, max_size=None) as ws:
        session = Session(ws)
        session.seen = []
        await session.until("session.created")
        update = {"instructions": INSTRUCTIONS}
        if tools:
            update["tools"] = TOOLS
        await session.send({"type": "session.update", "session": update})
        await session.until("session.updated")
        if not tools:
            group, turns, check = case
            for turn in turns[:-1]:
                await session.say(turn)
                await session.respond()
            await session.say(turns[-1])
            reply, first_ms, _ = await session.respond()
            return {"group": group, "question": turns[-1], "reply": reply, "right": bool(check(reply)),
                    "words": len(reply.split()), "first_audio_ms": first_ms}
        question, (name, argument, value_ok), output, check = case
        await session.say(question)
        reply, first_ms, calls = await session.respond()
        call = next((c for c in calls if c["name"] == name), None)
        called = False
        if call is not None:
            try:
                called = value_ok(json.loads(call["arguments"]).get(argument))
            except (ValueError, AttributeError):
                called = False
            await session.send({"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": json.dumps(output)}})
            await session.until("conversation.item.done")
            reply, first_ms, _ = await session.respond()
        return {"group": "tools", "question": question, "call": call and {k: call[k] for k in ("name", "arguments")},
                "called_right": called, "reply": reply, "right": bool(called and check(reply)),
                "words": len(reply.split()), "first_audio_ms": first_ms}


async def run_all(server, groups=None, per_group=None):
    """Rows of every case (``groups``: only the cases of these groups; ``per_group``: only the
    first that many of each)."""
    url = f"{server.base_url}/realtime"
    chosen = {}
    for case in CASES:
        if groups is None or case[0] in groups:
            chosen.setdefault(case[0], []).append(case)
    rows = [await ask(url, case) for cases in chosen.values() for case in cases[:per_group]]
    if groups is None or "tools" in groups:
        rows += [await ask(url, case, tools=True) for case in TOOL_CASES[:per_group]]
    return rows


def summary(rows):
    groups = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    table = {group: {"cases": len(items), "accuracy": round(sum(r["right"] for r in items) / len(items), 2),
                     "median_words": statistics.median(r["words"] for r in items),
                     "first_audio_ms": stats([r["first_audio_ms"] for r in items if r["first_audio_ms"]])}
             for group, items in groups.items()}
    table["all"] = {"cases": len(rows), "accuracy": round(sum(r["right"] for r in rows) / len(rows), 2),
                    "median_words": statistics.median(r["words"] for r in rows)}
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compare-voice-style", action="store_true")
    parser.add_argument("--compare-tool-calls", action="store_true")
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--llm-model", help="a .gguf file instead of the default model")
    model.add_argument("--llm-base-url", help="an OpenAI-compatible endpoint instead of the local model")
    model.add_argument("--endpoint-gguf", help="a .gguf served by llama.cpp's server, reached as an endpoint")
    args = parser.parse_args(argv)
    base = {}
    if args.llm_model:
        base["LLM_MODEL"] = args.llm_model
    if args.llm_base_url:
        base["LLM_BASE_URL"] = args.llm_base_url
    configurations = {"voice_style": ({}, None)}
    if args.compare_voice_style:
        configurations = {"no_voice_style": ({"VOICE_STYLE": ""}, None), **configurations}
    if args.compare_tool_calls:
        configurations.update({f"tools_{mode}": ({"LLM_TOOL_CALLS": mode}, {"tools"}) for mode in ("native", "prompt")})
    with contextlib.ExitStack() as stack:
        if args.endpoint_gguf:
            base["LLM_BASE_URL"] = stack.enter_context(llama_endpoint(args.endpoint_gguf))
        results = {}
        for name, (settings, groups) in configurations.items():
            server = start_server(1, {**base, **settings})
            try:
                rows = asyncio.run(run_all(server, groups))
            finally:
                server.stop()
            results[name] = {"summary": summary(rows), "cases": rows}
    model = (args.llm_model or args.llm_base_url or (args.endpoint_gguf and f"{args.endpoint_gguf} (llama.cpp server)")
             or "default (SmolLM2-135M-Instruct Q4_1)")
    emit("answers", {"model": model, "instructions": INSTRUCTIONS, "configurations": results})


if __name__ == "__main__":
    main()
