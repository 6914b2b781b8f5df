"""The fp32 graph derived from a dynamically quantized one computes what the original fp32 model
computed. The quantized input is made by onnxruntime's own quantizer (not by this project), from
a small model with the three kinds of node Kokoro has: MatMul, Conv (with and without a bias) and
a bidirectional LSTM."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from pool.backends.dequantize import UnknownPatternError, dequantize

HIDDEN = 8


def small_model(path, rng):
    """x [1, 4, 10] -> Conv(k=3, bias) -> Conv(k=1, no bias) -> Transpose -> MatMul -> LSTM -> y."""
    def weight(name, *shape):
        return numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "conv1_w", "conv1_b"], ["c1"], pads=[1, 1], kernel_shape=[3]),
        helper.make_node("Conv", ["c1", "conv2_w"], ["c2"], kernel_shape=[1]),
        helper.make_node("Transpose", ["c2"], ["t"], perm=[2, 0, 1]),  # [seq=10, batch=1, 6]
        helper.make_node("MatMul", ["t", "mm_w"], ["m"]),
        helper.make_node("LSTM", ["m", "lstm_w", "lstm_r", "lstm_b"], ["y", "", ""], hidden_size=HIDDEN,
                         direction="bidirectional"),
    ]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight("conv1_w", 6, 4, 3), weight("conv1_b", 6), weight("conv2_w", 6, 6, 1), weight("mm_w", 6, 12),
         weight("lstm_w", 2, 4 * HIDDEN, 12), weight("lstm_r", 2, 4 * HIDDEN, HIDDEN),
         weight("lstm_b", 2, 8 * HIDDEN)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture
def models(tmp_path):
    rng = np.random.default_rng(7)
    original, quantized, derived = tmp_path / "fp32.onnx", tmp_path / "int8.onnx", tmp_path / "derived.onnx"
    small_model(original, rng)
    quantize_dynamic(original, quantized, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Conv", "LSTM"])
    return original, quantized, derived, rng.normal(0, 1, (1, 4, 10)).astype(np.float32)


def test_the_derived_graph_computes_the_original_model(models):
    original, quantized, derived, x = models
    ops = {node.op_type for node in onnx.load(str(quantized)).graph.node}
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"} <= ops  # the quantizer did its part

    counts = dequantize(quantized, derived)

    assert counts == {"MatMul": 1, "Conv": 2, "LSTM": 1}
    ops = {node.op_type for node in onnx.load(str(derived)).graph.node}
    assert not ops & {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM", "DynamicQuantizeLinear"}
    expected, int8, fp32 = run(original, x), run(quantized, x), run(derived, x)
    # Only the weights' rounding is left: the derived graph is closer to the original than the
    # int8 graph (which also rounds every activation) is.
    assert np.abs(fp32 - expected).max() < 0.05
    assert np.abs(fp32 - expected).mean() < np.abs(int8 - expected).mean()


def test_an_unknown_quantized_pattern_is_refused_and_nothing_is_written(models):
    _, quantized, derived, _ = models
    model = onnx.load(str(quantized))
    matmul = next(node for node in model.graph.node if node.op_type == "MatMulInteger")
    cast = next(node for node in model.graph.node if matmul.output[0] in node.input)
    cast.op_type = "Identity"  # the int32 result no longer goes through Cast -> Mul(scale)
    del cast.attribute[:]
    onnx.save(model, str(quantized))

    with pytest.raises(UnknownPatternError, match="not one Cast"):
        dequantize(quantized, derived)
    assert not derived.exists()
