"""The one place where the project's settings are read.

Everything the pool and the protocol can be told lives in one dict, ``settings.S2S``, merged over
``DEFAULTS`` and cached. A ``setting_changed`` receiver drops the cache so ``override_settings``
works in tests (the pattern of django-debug-toolbar's ``debug_toolbar/settings.py``).
"""

import functools
import os
from pathlib import Path

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver


def _default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return str(Path(base) / "s2s-realtime")


DEFAULTS = {
    # The pool: how many PipelineUnits one server process holds.
    "POOL_SIZE": 2,
    # Seconds a released unit may take to drain before it is quarantined.
    "RELEASE_AFTER_SECONDS": 180.0,
    # "default": the real models below; "scripted": the scripted test backend (tests only); or
    # the dotted path of a function ``load(config) -> pool.backends.Backends`` (your own models).
    "BACKEND": "default",
    # Where `prepare_models` writes the ready-to-load cache (env S2S_CACHE_DIR wins).
    "MODEL_CACHE_DIR": os.environ.get("S2S_CACHE_DIR") or _default_cache_dir(),
    # Each stage takes a local path; None means the embedded default from installed packages.
    "VAD_MODEL": None,  # a Silero VAD .onnx file
    "STT_MODEL": None,  # a CTranslate2 Whisper folder
    # The default models: "english" (Whisper tiny.en, English voices) or "multilingual" (Whisper
    # base with language detection, and Spanish, French, Italian, Portuguese and Hindi voices;
    # needs the `multilingual` extra). docs/MODELS.md.
    "PRESET": "english",
    "LLM_MODEL": None,  # a .gguf file (run by llama.cpp) or a transformers checkpoint folder
    # A GGUF's function tools: "native" (llama.cpp's Jinja chat template shows them to the model
    # in its own trained form), "prompt" (offered in the system prompt, for templates without
    # tools), or "auto": native when the chat template takes tools.
    "LLM_TOOL_CALLS": "auto",
    "LLM_CHAT_TEMPLATE": None,  # a Jinja file that replaces the GGUF's own chat template
    # An OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp server, Ollama) instead of
    # the local LLM, e.g. "http://127.0.0.1:11434/v1".
    "LLM_BASE_URL": None,
    "LLM_API_KEY": "",
    "LLM_API_MODEL": "",
    # Seconds the endpoint may take to connect (at most 5) and between parts of its stream; then
    # the response fails with model_error and the session goes on.
    "LLM_TIMEOUT_SECONDS": 30.0,
    "LLM_MAX_OUTPUT_TOKENS": 120,
    # Conversation sent to the LLM per response (characters of chat messages, newest first), with
    # the session's truncation "auto": a long call keeps a bounded prompt.
    "LLM_CONTEXT_CHARS": 8000,
    "TTS_MODEL": None,  # a Kokoro .onnx file
    # The packaged Kokoro's variant: "int8", "fp32" or "int8-gemm" (the same weights, derived by
    # prepare_models; int8 with its convolutions as int8 matrix products), or "auto": the one
    # prepare_models timed fastest on this CPU.
    "TTS_VARIANT": "auto",
    # The least encoder window of a peek at speech over a reply, seconds: 10 tells backchannels
    # from interruptions best; 0 (the audio + 4 s) halves a peek's cost where the CPU is too slow
    # for 10 to decide in time (BENCHMARKS.md 14h). None: the one prepare_models chose for this
    # CPU (pool.backends.cache.peek_window_floor; 10 for an STT_MODEL of your own).
    "PEEK_WINDOW_FLOOR_S": None,
    "TURN_MODEL": None,  # a Smart Turn v3.x .onnx file (semantic_vad's end-of-turn model)
    "TTS_VOICES": None,  # a Kokoro voices .npz file
    # Threads for each library, decided together for a 2-core machine: VAD is tiny and runs
    # alone; STT, LLM and TTS rarely overlap within one turn except LLM and TTS while streaming.
    # "blas": numpy's BLAS for the whole process (None: OpenBLAS's own count). 1 frees the core
    # its idle helper spins on, for many listening sessions, but slowed Whisper by a third on a
    # Zen 3 VM and not on a Zen 5 (pool.backends.limit_blas_threads); "auto": 1 unless a
    # transcription is slower so on this CPU (pool.backends.cache.blas_threads).
    "THREADS": {"vad": 1, "stt": 2, "llm": 2, "tts": 2, "blas": "auto"},
    # Model runs (a transcription, a local LLM's next phrase, a synthesis) the process's units
    # make at once, earliest deadline first (pool.pipeline.compute). 1: each has the THREADS of its
    # library, so a waiting user's turn is done soonest; 3 x the pool size: every unit's at once,
    # the cores shared by the OS (as before the queue).
    "COMPUTE_RUNS_AT_ONCE": 1,
    # Speculative syntheses run beside those, at the lowest OS priority, on a second copy of the
    # TTS model (about 150 MB more): the kernel gives the cores to real work at once, so a user
    # who stops speaking never waits for a reply that may never be used (Linux only).
    "COMPUTE_BACKGROUND": True,
    # Later phrases of two replies are synthesized side by side, one core each, on a third copy
    # of the TTS model (190 MB more for int8-gemm), when both clients hold audio enough for that
    # or have run out: two cores then speak more a second than one synthesis at a time on both
    # (BENCHMARKS.md 5i, 5j). A reply's first phrase always has both cores.
    "COMPUTE_SIDE_BY_SIDE": True,
    # A connect that finds every unit busy but some draining waits this long for one (seconds).
    "CLAIM_WAIT_SECONDS": 3.0,
    # Close a session that sends nothing for this many seconds (None: never).
    "IDLE_TIMEOUT_SECONDS": None,
    # At SIGTERM/SIGINT the process drains (no new sessions) and its live sessions may go on this
    # long (seconds; container platforms wait 30 s, then kill); then the rest are closed with 1001
    # and given SHUTDOWN_DRAIN_SECONDS to drain before the process exits. A second signal stops
    # at once.
    "SHUTDOWN_GRACE_SECONDS": 30.0,
    "SHUTDOWN_DRAIN_SECONDS": 5.0,
    # Process heartbeat in the database, and the silence after which a process counts as lost.
    "HEARTBEAT_SECONDS": 5.0,
    "LOST_AFTER_SECONDS": 30.0,
    # Who may connect: API keys always; clients without a key only when this is True. Never
    # inferred from addresses: behind a reverse proxy on the same host every client arrives from
    # loopback. The local quick start (`make serve`) turns it on with `runpool --allow-anonymous`.
    "ALLOW_ANONYMOUS": False,
    # Addresses or networks (e.g. "127.0.0.1", "10.0.0.0/8") of reverse proxies whose
    # X-Forwarded-For / Forwarded headers name the client; from anyone else they are ignored.
    "TRUSTED_PROXIES": [],
    # The header those proxies write the client's address in: "X-Forwarded-For" (nginx, Caddy,
    # HAProxy) or "Forwarded" (RFC 7239). The other one is ignored: it comes from the client.
    "PROXY_ADDRESS_HEADER": "X-Forwarded-For",
    # New sessions one client address may open per minute, per process (None: no limit).
    "CONNECTS_PER_MINUTE": 60,
    # A session is closed (error session_expired, close 1000) after this long; OpenAI's limit.
    "MAX_SESSION_SECONDS": 60 * 60,
    # A client that leaves the server's writes unread this long (its connection's buffer full)
    # is closed with error client_too_slow and 1008, so its replies do not pile up in memory.
    "SLOW_CLIENT_SECONDS": 20.0,
    # Browser origins allowed to connect (host names, as ALLOWED_HOSTS); None: ALLOWED_HOSTS.
    "ALLOWED_ORIGINS": None,
    # Where the WebSocket endpoint is mounted, for the browser page (a host site may use a prefix).
    "REALTIME_PATH": "/v1/realtime",
    # Where clients reach this process, without the endpoint's path: "wss://voice.example.com/a"
    # (behind a proxy that routes /a to it) or "ws://10.0.0.5:8001". A client secret that reserves
    # a unit of this process sends its client to PUBLIC_URL + REALTIME_PATH. None (or runpool
    # without --public-url): only this process's own answers to POST /v1/realtime/client_secrets
    # reserve its units, and send clients to the address the request came to (through a proxy:
    # the public host). A bind address says nothing of how clients reach it, so none is guessed.
    "PUBLIC_URL": None,
    # POST /v1/realtime/client_secrets: a secret's lifetime when the request names none, and the
    # longest allowed (seconds; OpenAI's are 600 and 7200). Its unit stays reserved until it is
    # used or expires.
    "CLIENT_SECRET_SECONDS": 600,
    "CLIENT_SECRET_MAX_SECONDS": 7200,
    # Secrets issued without an API key (POST /client_secret for a logged-in user, or anonymous
    # where ALLOW_ANONYMOUS is on) live at most this long, and each user (or anonymous address)
    # may hold this many unused at once: nobody can reserve the pool away without a key.
    "USER_CLIENT_SECRET_SECONDS": 60,
    "CLIENT_SECRETS_PER_USER": 2,
    # A token that may read GET /v1/pool and /metrics (Authorization: Bearer <token>); staff
    # users always may.
    "STATUS_TOKEN": None,
    # Turn detection of a new session: "server_vad" (as OpenAI's API) or "semantic_vad" (the
    # end-of-turn model decides when the user has finished).
    "DEFAULT_TURN_DETECTION": "server_vad",
    # While the assistant speaks (its reply has sent audio, or that audio is still playing on the
    # client), new speech is judged by a peek (a transcript of it so far) at this many ms of
    # voiced speech and each 150 ms after (realtime.session.turns.PEEK_STEP_MS), at its first
    # pause and at its end: it interrupts once a peek hears an interruption
    # (realtime.session.turns); speech that ends before is a backchannel or noise and
    # is dropped. Until then speech_started and the reply's next events are held back. 300 ms:
    # the interruption corpus's tune part (500 ms missed more short "Wait."s). 0: any speech
    # interrupts at once (OpenAI's behaviour).
    "INTERRUPT_MIN_SPEECH_MS": 300,
    # Backchannel words (lower case, letters only). A peek made only of these, and of hums
    # however they are spelled (m, h, n and u only: "mm-hmm", "uh-huh"), is not an interruption.
    # "im": Whisper writes the start of a hum as "I'm"; a user who goes on ("I'm sorry, what?")
    # is heard by the next peek, or by the transcript of the whole utterance. "all": "all
    # right", as Whisper also spells "alright". "well": Whisper's "Wow" at 320 ms voiced (a false
    # of the tune part, 14l); a user who goes on ("Well, I meant...") is heard by the next peek.
    "BACKCHANNEL_WORDS": [
        "ah", "oh", "aha", "yeah", "yep", "yup", "yes", "ok", "okay", "right", "sure", "alright", "all", "and",
        "i", "im", "see", "got", "it", "cool", "nice", "wow", "well", "really", "true", "exactly",
    ],
    # The STT's prompt for peeks: Whisper writes a listener's "mm-hmm" as words it has been told
    # to expect, not as look-alike words ("And Memhome.").
    "BACKCHANNEL_PROMPT": "Mm-hmm. Uh-huh. Yeah. Okay. Right.",
    # A peek's audio is scored against these phrases (Whisper's log-probability of each, forced,
    # against its own transcript's: WhisperSTT.hear); speech at least BACKCHANNEL_LIKENESS like
    # one of them is a backchannel, whatever words Whisper wrote for it. "en"'s count in every
    # language. Tuned on the interruption corpus's tune part (bench.interruptions).
    "BACKCHANNEL_PHRASES": {
        "en": ["Mm-hmm.", "Uh-huh.", "Mhm.", "Hmm.", "Yeah.", "Yes.", "Yep.", "Okay.", "Right.", "I see.", "Sure.",
               "Oh.", "Wow.", "Ha ha ha.", "Haha."],
        "es": ["Sí.", "Vale.", "Ajá.", "Claro."],
        "fr": ["Oui.", "D'accord.", "Ah bon.", "Ouais."],
        "it": ["Sì.", "Certo.", "Ah."],
        "pt": ["Sim.", "Tá bom.", "Ah."],
        "hi": ["हाँ।", "अच्छा।", "ठीक है।"],
    },
    "BACKCHANNEL_LIKENESS": -1.8,
    # Short speech judged by its end (off: 0): a peek before BACKCHANNEL_MAX_MS of voiced speech
    # that would interrupt without a cue word, in audio not clearly unlike a backchannel (at least
    # INTERRUPTION_LIKENESS), waits for the next peek, and speech that ends so short and unsure is
    # a backchannel. Whisper tiny.en writes words for a hum or a laugh in a voice it never heard
    # ("Dye her", "I'm high.") at a likeness of -1.9 to -3.5, and such speech ends within about
    # 0.75 s. 750 and -3.5 were read off the interruption corpus's tune part; held out, they
    # removed 2 of 10 backchannel falses but, with the real reply, held real interruptions a
    # peek step too long (missed 8/82 -> 13/82): off by default (BENCHMARKS.md, section 14e).
    "BACKCHANNEL_MAX_MS": 0,
    "INTERRUPTION_LIKENESS": -3.5,
    # Words that mark an interruption: a peek that hears one of them interrupts at once, however
    # like a backchannel it sounds ("Wait" heard at 300 ms sounds like "Wow"); the other languages'
    # count while the user speaks them.
    "INTERRUPTION_WORDS": ["wait", "stop", "no", "hold", "hang", "sorry", "what", "pardon", "excuse", "hey"],
    "INTERRUPTION_WORDS_BY_LANGUAGE": {
        "es": ["espera", "para", "no", "perdon", "perdona", "que", "oye"],
        "fr": ["attends", "attendez", "arrete", "arretez", "non", "pardon", "quoi", "hein"],
        "it": ["aspetta", "aspetti", "ferma", "no", "scusa", "scusi", "cosa"],
        "pt": ["espera", "espere", "para", "pare", "nao", "desculpa", "desculpe", "que"],
        "hi": ["रुको", "रुकिए", "नहीं", "माफ़", "क्या", "ruko", "nahin", "kya"],
    },
    # The same, in the other languages of the multilingual preset: they count while the user
    # speaks that language (the session's transcription language, else the last one detected).
    # Compared without accents; Hindi in Devanagari and as Whisper may romanise it.
    "BACKCHANNEL_WORDS_BY_LANGUAGE": {
        "es": ["sí", "si", "vale", "claro", "ajá", "ya", "bueno", "vaya", "exacto", "entiendo", "ok", "okay",
               "ah", "oh", "eh"],
        "fr": ["oui", "ouais", "d'accord", "ok", "okay", "bon", "bien", "voilà", "exactement", "c'est", "ça",
               "vrai", "ah", "oh", "hein"],
        "it": ["sì", "si", "certo", "ok", "okay", "va", "bene", "già", "capito", "esatto", "davvero", "ah", "oh"],
        "pt": ["sim", "tá", "ok", "okay", "claro", "certo", "entendi", "isso", "exato", "uhum", "aham", "ah", "oh", "é"],
        "hi": ["हाँ", "हां", "अच्छा", "ठीक", "है", "जी", "हम्म", "ओके", "haan", "han", "accha", "achha", "theek",
               "thik", "ji", "ok", "okay"],
    },
    # Transports whose clients' microphones may hear the assistant from their own speakers: the
    # server cancels that echo with what it sent as the reference (pool.backends.echo). A
    # browser's WebRTC cancels its own echo. [] turns it off.
    "ECHO_CANCELLATION_TRANSPORTS": ["websocket"],
    # At the first pause of a turn that would be answered at once, start its reply (LLM and first
    # phrase) on the transcript made there, held: the commit adopts it if the turn ends with the
    # same words, else it is discarded without a trace. Its work runs only when no other is due.
    "SPECULATIVE_REPLIES": True,
    # Defaults of a new session, as in OpenAI's hosted API.
    "DEFAULT_INSTRUCTIONS": (
        "You are a helpful, friendly voice assistant. Answer in one or two short sentences "
        "of plain spoken English."
    ),
    "DEFAULT_VOICE": "alloy",
    # Said to the LLM before the session's instructions when a reply is spoken: what a voice
    # reply is (bench.answers measures it). "" or None: the session's instructions alone.
    "VOICE_STYLE": (
        "Your words are spoken aloud by a voice. Reply in short, plain spoken sentences, with no "
        "markdown, lists, headings, code, links or emoji."
    ),
    # input_image parts: data: URLs always; http(s) image URLs only of these hosts (the LLM
    # endpoint would fetch them, so a client cannot make it fetch arbitrary URLs). Default: none.
    "IMAGE_URL_HOSTS": [],
    # A session's `mcp` tools: the server lists their tools and calls them itself, on these hosts
    # only (so a client cannot make it send requests anywhere else), each list or call within
    # MCP_TIMEOUT_SECONDS; a reply runs at most MCP_MAX_ROUNDS rounds of calls.
    "MCP_SERVER_HOSTS": ["127.0.0.1", "localhost", "::1"],
    "MCP_TIMEOUT_SECONDS": 10.0,
    "MCP_MAX_ROUNDS": 3,
    # Session history (the admin's session page): at most this many records (items, errors,
    # responses) are kept per session; past it they are only counted.
    "HISTORY_MAX_ITEMS": 2000,
    # `manage.py prune_sessions` deletes finished sessions older than this, with their history
    # (days; None: keep them).
    "HISTORY_RETENTION_DAYS": 30,
    # When a user is deleted, the sessions of their API keys are "anonymise"d (their words and
    # recordings removed; times, counts and timings kept) or "delete"d (pool/signals.py).
    "HISTORY_ON_USER_DELETE": "anonymise",
    # Record each session's audio (the user's and the assistant's, FLAC through Django's
    # default_storage)? An API key's own "record audio" choice wins over this.
    "RECORD_AUDIO": False,
    # `manage.py prune_sessions` deletes recordings older than this (days; None: keep them).
    "RECORDING_RETENTION_DAYS": 7,
    # WebRTC (POST /v1/realtime/calls): the addresses offered to clients as host candidates
    # (env S2S_WEBRTC_HOST_ADDRESSES, comma-separated; empty: every interface's but loopback, as
    # aiortc finds them) and STUN/TURN servers for clients behind NAT, as a browser's iceServers:
    # [{"urls": "turn:turn.example.org:3478", "username": "...", "credential": "..."}].
    "WEBRTC_HOST_ADDRESSES": [],
    "WEBRTC_ICE_SERVERS": [],
    # Largest client WebSocket message (bytes). OpenAI accepts appends up to 15 MiB; Daphne is
    # configured a little above it so an oversize message gets an error event, not a dead socket.
    "MAX_MESSAGE_BYTES": 15 * 1024 * 1024,
}


_PATH = (str, os.PathLike)
# Keys that may be None, and their type when set; every other key has its default's type
# (a float key also takes an int). ``pool.checks`` holds ``settings.S2S`` to these.
OPTIONAL = {
    "VAD_MODEL": _PATH, "STT_MODEL": _PATH, "LLM_MODEL": _PATH, "TTS_MODEL": _PATH, "LLM_CHAT_TEMPLATE": _PATH,
    "TURN_MODEL": _PATH, "TTS_VOICES": _PATH, "LLM_BASE_URL": str, "STATUS_TOKEN": str, "PUBLIC_URL": str,
    "ALLOWED_ORIGINS": (list, tuple), "VOICE_STYLE": str, "IDLE_TIMEOUT_SECONDS": (int, float),
    "CONNECTS_PER_MINUTE": int, "MAX_SESSION_SECONDS": (int, float),
    "HISTORY_RETENTION_DAYS": (int, float), "RECORDING_RETENTION_DAYS": (int, float),
    "BACKCHANNEL_LIKENESS": (int, float), "BACKCHANNEL_PROMPT": str, "INTERRUPTION_LIKENESS": (int, float),
    "PEEK_WINDOW_FLOOR_S": (int, float),
}


def expected_type(key):
    """The type (or tuple of types) a value of ``key`` must have; None is checked by the caller."""
    if key in OPTIONAL:
        return OPTIONAL[key]
    if key == "MODEL_CACHE_DIR":
        return _PATH
    default = DEFAULTS[key]
    return (int, float) if isinstance(default, float) else type(default)


_PROCESS = {}  # set by `runpool` options, over settings.S2S


def set_for_process(**values):
    """Override keys for this process only (``runpool --allow-anonymous``)."""
    _PROCESS.update(values)
    get_config.cache_clear()


@functools.cache
def get_config():
    """Return the effective settings: ``DEFAULTS`` updated with ``settings.S2S``, then with
    ``set_for_process``.

    ``THREADS`` is merged key by key so a host can override one library's thread count.
    """
    user = dict(getattr(settings, "S2S", {}))
    config = {**DEFAULTS, **user, **_PROCESS}
    config["THREADS"] = {**DEFAULTS["THREADS"], **user.get("THREADS", {})}
    return config


@receiver(setting_changed)
def _reset_config(*, setting, **kwargs):
    if setting == "S2S":
        get_config.cache_clear()
