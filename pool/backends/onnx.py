"""One way to open an ONNX model for the CPU, shared by the VAD, TTS and end-of-turn backends."""

import onnxruntime as ort


def cpu_session(model_path, threads):
    """An onnxruntime session on the CPU with ``threads`` intra-op threads and one inter-op
    thread (the thread counts of all libraries are decided together: ``pool.conf`` THREADS),
    which sleep between parallel sections. ``run`` is thread-safe, so one session serves every
    unit. Raises onnxruntime's errors for a missing or invalid file."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # onnxruntime's threads spin by default while they wait for the next parallel section: a
    # story's Kokoro threads then took cores from a peek's Whisper beside them (on a Zen 4 a peek
    # took 183 ms beside the story, 138 ms without the spinning, ~80 ms alone; BENCHMARKS.md 14o).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
