"""``prepare_models --llm SOURCE``: a GGUF from a file, from a URL on a local HTTP server
(progress, resume after a cut connection, a wrong sha256 refused with nothing left half-written)
and by a Hugging Face name through the hub client's HF_ENDPOINT; the choice is recorded with its
size, sha256, name and license, and ``--llm packaged`` undoes it. No test reaches beyond
127.0.0.1."""

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from pool.backends.cache import PreparationError
from pool.backends.fetch import CHOICE_FILE, choose_packaged, chosen_llm, fetch_llm

from .helpers import PROJECT_DIR


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A small real GGUF, written by the gguf package (llama.cpp's own), with a name and license."""
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny-test.Q8_0.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("Tiny Test")
    writer.add_string("general.license", "apache-2.0")
    writer.add_tensor("weights", np.arange(300_000, dtype=np.float32))  # 1.2 MB: a download of several blocks
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class Files(BaseHTTPRequestHandler):
    """Serves ``server.files`` (path -> bytes) with HTTP Range; ``server.cut_after`` bytes into
    the first full response it closes the connection (a network that drops)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.server.files.get(self.path.split("?")[0])
        self.server.requests.append((self.path, self.headers.get("Range")))
        if body is None:
            self.send_error(404)
            return
        start = 0
        if self.headers.get("Range"):
            start = int(self.headers["Range"].split("=")[1].split("-")[0])
            if start >= len(body):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        cut, self.server.cut_after = self.server.cut_after, None
        self.wfile.write(body[start:start + cut] if cut else body[start:])
        if cut:
            self.wfile.flush()
            self.connection.close()

    def log_message(self, *args):
        pass


@pytest.fixture
def web(gguf_file):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    body = gguf_file.read_bytes()
    server.files = {"/models/tiny-test.Q8_0.gguf": body, "/org/tiny/resolve/main/tiny-test.Q8_0.gguf": body,
                    "/models/not-a-model.gguf": b"<html>not found</html>" * 100}
    server.requests, server.cut_after = [], None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.url = f"http://127.0.0.1:{server.server_port}"
    yield server
    server.shutdown()


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_is_copied_and_recorded_with_its_name_and_license(gguf_file, tmp_path):
    choice = fetch_llm(str(gguf_file), tmp_path, progress=False)
    assert chosen_llm(tmp_path) == tmp_path / "llm" / gguf_file.name
    assert sha(chosen_llm(tmp_path)) == sha(gguf_file) == choice["sha256"]
    assert (choice["name"], choice["license"], choice["size"]) == ("Tiny Test", "apache-2.0", gguf_file.stat().st_size)
    assert json.loads((tmp_path / CHOICE_FILE).read_text()) == choice
    choose_packaged(tmp_path)
    assert chosen_llm(tmp_path) is None


def test_a_download_cut_off_resumes_where_it_stopped(web, gguf_file, tmp_path, capsys):
    url = f"{web.url}/models/tiny-test.Q8_0.gguf"
    web.cut_after = 500_000
    with pytest.raises(PreparationError, match="cut off after 500000 .*run the same command again"):
        fetch_llm(url, tmp_path, sha256=sha(gguf_file))
    partial = tmp_path / "llm" / "tiny-test.Q8_0.gguf.partial"
    assert partial.stat().st_size == 500_000 and chosen_llm(tmp_path) is None
    fetch_llm(url, tmp_path, sha256=sha(gguf_file))
    assert web.requests[-1] == ("/models/tiny-test.Q8_0.gguf", "bytes=500000-")  # only the rest was asked for
    assert sha(chosen_llm(tmp_path)) == sha(gguf_file) and not partial.exists()
    assert "100%" in capsys.readouterr().err  # the progress bar


def test_a_wrong_sha256_is_refused_and_nothing_is_left(web, tmp_path):
    with pytest.raises(PreparationError, match="has sha256 .* not the 0{64} asked for; nothing was kept"):
        fetch_llm(f"{web.url}/models/tiny-test.Q8_0.gguf", tmp_path, sha256="0" * 64, progress=False)
    assert list((tmp_path / "llm").iterdir()) == [] and chosen_llm(tmp_path) is None


def test_what_is_not_a_gguf_is_refused(web, tmp_path):
    with pytest.raises(PreparationError, match="is not a GGUF file"):
        fetch_llm(f"{web.url}/models/not-a-model.gguf", tmp_path, progress=False)
    with pytest.raises(PreparationError, match="HTTP 404"):
        fetch_llm(f"{web.url}/models/missing.gguf", tmp_path, progress=False)
    with pytest.raises(PreparationError, match="give a .gguf file, an https:// URL or a Hugging Face"):
        fetch_llm("not a source", tmp_path, progress=False)
    assert chosen_llm(tmp_path) is None


def test_a_recorded_choice_whose_file_changed_is_a_clear_error(gguf_file, tmp_path):
    fetch_llm(str(gguf_file), tmp_path, progress=False)
    with open(tmp_path / "llm" / gguf_file.name, "ab") as file:
        file.write(b"x")
    with pytest.raises(PreparationError, match="missing or changed; run `manage.py prepare_models --llm"):
        chosen_llm(tmp_path)


@pytest.mark.models
def test_prepare_models_takes_a_hugging_face_name_through_hf_endpoint(web, gguf_file, tmp_path):
    """The command as a user runs it, with the hub client pointed at the local server."""
    from pool.conf import get_config

    cache = tmp_path / "cache"
    prepared = get_config()["MODEL_CACHE_DIR"]
    env = {**os.environ, "HF_ENDPOINT": web.url, "S2S_CACHE_DIR": str(cache)}
    subprocess.run(["cp", "-al", str(prepared), str(cache)], check=True)  # hard links: instant, and nothing here writes in place
    run = subprocess.run([sys.executable, "manage.py", "prepare_models", "--llm", "org/tiny/tiny-test.Q8_0.gguf",
                          "--sha256", sha(gguf_file)], cwd=PROJECT_DIR, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "runpool uses Tiny Test (1 MB, license: apache-2.0)" in run.stdout
    assert web.requests[-1][0] == "/org/tiny/resolve/main/tiny-test.Q8_0.gguf"
    assert sha(chosen_llm(cache)) == sha(gguf_file)
    back = subprocess.run([sys.executable, "manage.py", "prepare_models", "--llm", "packaged"], cwd=PROJECT_DIR,
                          env=env, capture_output=True, text=True, timeout=300)
    assert back.returncode == 0 and chosen_llm(cache) is None
