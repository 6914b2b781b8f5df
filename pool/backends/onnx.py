"""One way to open an ONNX model for the CPU, shared by the VAD, TTS and end-of-turn backends."""

import onnxruntime as ort


def cpu_session(model_path, threads):
    """An onnxruntime session on the CPU with ``threads`` intra-op threads and one inter-op
    thread (the thread counts of all libraries are decided together: ``pool.conf`` THREADS).
    ``run`` is thread-safe, so one session serves every unit. Raises onnxruntime's errors for
    a missing or invalid file."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
