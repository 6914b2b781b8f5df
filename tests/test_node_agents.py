"""The @openai/agents JS SDK against live servers: a Node test suite run by the Python suite."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from realtime.audio import float_to_pcm16
from realtime.client import load_audio

from .helpers import HOTWORDS, JFK

NODE_DIR = Path(__file__).resolve().parent / "node"
pytestmark = pytest.mark.node


def test_openai_agents_sdk_voice_turn_interruption_and_tool_call(server, scripted_server, tmp_path):
    node = shutil.which("node")
    assert node, "Node.js is needed for the @openai/agents tests (apt-get install nodejs npm)"
    assert (NODE_DIR / "node_modules" / "@openai" / "agents").exists(), "run: npm ci --prefix tests/node"
    speech, barge = tmp_path / "speech.pcm", tmp_path / "barge.pcm"
    speech.write_bytes(float_to_pcm16(load_audio(JFK)))
    barge.write_bytes(float_to_pcm16(load_audio(HOTWORDS)))
    env = {**os.environ, "S2S_REAL_URL": f"{server.base_url}/realtime",
           "S2S_SCRIPTED_URL": f"{scripted_server.base_url}/realtime",
           "S2S_SPEECH_PCM": str(speech), "S2S_BARGE_PCM": str(barge)}
    run = subprocess.run([node, "--test", "--test-reporter=spec", "agents.test.mjs"], cwd=NODE_DIR, env=env,
                         capture_output=True, text=True, timeout=600)
    print(run.stdout[-5000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    assert "pass 3" in run.stdout
