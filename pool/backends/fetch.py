"""A better LLM in one command: ``manage.py prepare_models --llm SOURCE`` brings a GGUF into the
model cache and makes it the default LLM of ``runpool``.

SOURCE is a file path (copied: an offline machine's way), an ``https://`` (or ``http://``) URL,
or a Hugging Face ``org/repo/file.gguf`` name, whose URL the ``huggingface_hub`` client builds
(it honours its documented ``HF_ENDPOINT`` variable, so a mirror or a test server can stand in).
A download is resumable: it goes to ``<name>.partial`` and a second run asks for the rest
(HTTP Range); a tqdm bar shows its progress. With ``sha256`` the file is checked before it takes
its name; a mismatch deletes the partial file and raises, so nothing half-written is ever used.
The GGUF's own metadata gives its name and license (``general.name``, ``general.license``); the
choice, with its size, sha256 and source, is written to ``llm.json`` in the cache, which
``load_default`` reads when ``S2S["LLM_MODEL"]`` is not set. ``--llm packaged`` goes back to the
packaged SmolLM2.
"""

import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from pool.backends.cache import PreparationError, sha256_file

CHOICE_FILE = "llm.json"  # in the model cache: the LLM prepare_models --llm chose
HUB_NAME = re.compile(r"^[\w.-]+/[\w.-]+/(?:[\w.-]+/)*[\w.-]+\.gguf$")
BLOCK = 1 << 20


def chosen_llm(cache_dir):
    """The GGUF ``prepare_models --llm`` chose (a Path), or None for the packaged model. Raises
    PreparationError when the recorded file is missing or its size changed."""
    path = Path(cache_dir) / CHOICE_FILE
    if not path.exists():
        return None
    choice = json.loads(path.read_text())
    model = Path(cache_dir) / choice["file"]
    if not model.exists() or model.stat().st_size != choice["size"]:
        raise PreparationError(f"The LLM chosen with `prepare_models --llm` ({model}) is missing or changed; run "
                               f"`manage.py prepare_models --llm {choice['source']}` again, or `--llm packaged`.")
    return model


def choose_packaged(cache_dir):
    """Go back to the packaged LLM (the chosen file stays on disk until removed by hand)."""
    (Path(cache_dir) / CHOICE_FILE).unlink(missing_ok=True)


def fetch_llm(source, cache_dir, sha256=None, progress=True):
    """Bring the GGUF ``source`` into ``cache_dir/llm/`` and record it as the LLM to use.
    Returns the recorded choice: ``{"file", "source", "size", "sha256", "name", "license"}``.

    Raises PreparationError for a source that is none of the three forms, a download that fails
    (the partial file is kept for the next run to resume), a sha256 that does not match (nothing
    kept), or a file that is not a GGUF.
    """
    target_dir = Path(cache_dir) / "llm"
    target_dir.mkdir(parents=True, exist_ok=True)
    if Path(source).expanduser().is_file():
        origin = Path(source).expanduser()
        target = target_dir / origin.name
        partial = target.with_name(target.name + ".partial")
        _copy(origin, partial, progress)
    else:
        url = _url(source)
        target = target_dir / url.rsplit("/", 1)[-1].split("?", 1)[0]
        partial = target.with_name(target.name + ".partial")
        _download(url, partial, progress)
    digest = sha256_file(partial)
    if sha256 and digest != sha256.lower():
        partial.unlink()
        raise PreparationError(f"{source} has sha256 {digest}, not the {sha256} asked for; nothing was kept.")
    metadata = _gguf_metadata(partial, source)
    os.replace(partial, target)
    choice = {"file": str(target.relative_to(cache_dir)), "source": str(source), "size": target.stat().st_size,
              "sha256": digest, **metadata}
    record = Path(cache_dir) / CHOICE_FILE
    record.with_suffix(".partial").write_text(json.dumps(choice, indent=2))
    os.replace(record.with_suffix(".partial"), record)
    return choice


def _url(source):
    if re.match(r"^https?://", source):
        return source
    if HUB_NAME.match(source):
        from huggingface_hub import hf_hub_url

        org, repo, filename = source.split("/", 2)
        return hf_hub_url(f"{org}/{repo}", filename)
    raise PreparationError(f"--llm {source!r}: give a .gguf file, an https:// URL or a Hugging Face "
                           "org/repo/file.gguf name.")


def _copy(origin, partial, progress):
    with open(origin, "rb") as source, open(partial, "wb") as out, tqdm(
            total=origin.stat().st_size, unit="B", unit_scale=True, desc=origin.name, disable=not progress) as bar:
        for block in iter(lambda: source.read(BLOCK), b""):
            out.write(block)
            bar.update(len(block))


def _download(url, partial, progress):
    """Download ``url`` to ``partial``, going on from what an earlier run left there."""
    have = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # asked for bytes past the end: the earlier run had them all
            return
        raise PreparationError(f"Downloading {url} failed: HTTP {exc.code} {exc.reason}.") from exc
    except OSError as exc:
        raise PreparationError(f"Downloading {url} failed: {exc}.") from exc
    with response:
        resumed = response.status == 206
        length = int(response.headers.get("Content-Length") or 0)
        total = (have if resumed else 0) + length or None
        with open(partial, "ab" if resumed else "wb") as out, tqdm(
                total=total, initial=have if resumed else 0, unit="B", unit_scale=True,
                desc=url.rsplit("/", 1)[-1], disable=not progress) as bar:
            try:
                for block in iter(lambda: response.read(BLOCK), b""):
                    out.write(block)
                    bar.update(len(block))
            except OSError as exc:
                raise PreparationError(f"Downloading {url} was cut off after {out.tell()} bytes ({exc}); run the "
                                       "same command again to go on from there.") from exc
        if total and partial.stat().st_size < total:
            raise PreparationError(f"Downloading {url} was cut off after {partial.stat().st_size} of {total} bytes; "
                                   "run the same command again to go on from there.")


def _gguf_metadata(path, source):
    """``{"name", "license"}`` from a GGUF's header. Raises PreparationError (deleting ``path``)
    when it is not a GGUF."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        path.unlink()
        raise PreparationError(f"{source} is not a GGUF file (it starts with {magic!r}); nothing was kept.")
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields

    def text(key):
        field = fields.get(key)
        if field is None or not field.data:
            return None
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")

    return {"name": text("general.name"), "license": text("general.license")}
