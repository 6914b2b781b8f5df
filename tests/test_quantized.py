"""The graphs derived from a dynamically quantized one compute what the original fp32 model
computed: the fp32 graph, and the int8 graph whose convolutions are int8 matrix products. The
quantized input is made by onnxruntime's own quantizer (not by this project), from a small model
with the kinds of node Kokoro has: MatMul, 1-D Conv (with and without a bias, dilated, strided)
and a bidirectional LSTM."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from pool.backends.quantized import GEMM_WEIGHT_MAX, UnknownPatternError, dequantize, gemm_convs

HIDDEN = 8


def small_model(path, rng):
    """x [1, 4, 20] -> Conv(k=3, bias) -> Conv(k=1, no bias) -> Conv(k=3, dilation 2, stride 2,
    bias) -> Transpose -> MatMul -> LSTM -> y."""
    def weight(name, *shape):
        return numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "conv1_w", "conv1_b"], ["c1"], pads=[1, 1], kernel_shape=[3]),
        helper.make_node("Conv", ["c1", "conv2_w"], ["c2"], kernel_shape=[1]),
        helper.make_node("Conv", ["c2", "conv3_w", "conv3_b"], ["c3"], pads=[2, 1], kernel_shape=[3], dilations=[2],
                         strides=[2]),
        helper.make_node("Transpose", ["c3"], ["t"], perm=[2, 0, 1]),  # [seq=10, batch=1, 6]
        helper.make_node("MatMul", ["t", "mm_w"], ["m"]),
        helper.make_node("LSTM", ["m", "lstm_w", "lstm_r", "lstm_b"], ["y", "", ""], hidden_size=HIDDEN,
                         direction="bidirectional"),
    ]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight("conv1_w", 6, 4, 3), weight("conv1_b", 6), weight("conv2_w", 6, 6, 1), weight("conv3_w", 6, 6, 3),
         weight("conv3_b", 6), weight("mm_w", 6, 12),
         weight("lstm_w", 2, 4 * HIDDEN, 12), weight("lstm_r", 2, 4 * HIDDEN, HIDDEN),
         weight("lstm_b", 2, 8 * HIDDEN)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture(params=[QuantType.QInt8, QuantType.QUInt8], ids=["int8 weights", "uint8 weights"])
def models(tmp_path, request):
    """Kokoro's convolutions have uint8 weights, its MatMuls int8 ones; the quantizer gives all one kind."""
    rng = np.random.default_rng(7)
    original, quantized, derived = tmp_path / "fp32.onnx", tmp_path / "int8.onnx", tmp_path / "derived.onnx"
    small_model(original, rng)
    quantize_dynamic(original, quantized, weight_type=request.param, op_types_to_quantize=["MatMul", "Conv", "LSTM"])
    return original, quantized, derived, rng.normal(0, 1, (1, 4, 20)).astype(np.float32)


def test_the_derived_graph_computes_the_original_model(models):
    original, quantized, derived, x = models
    ops = {node.op_type for node in onnx.load(str(quantized)).graph.node}
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"} <= ops  # the quantizer did its part

    counts = dequantize(quantized, derived)

    assert counts == {"MatMul": 1, "Conv": 3, "LSTM": 1}
    ops = {node.op_type for node in onnx.load(str(derived)).graph.node}
    assert not ops & {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM", "DynamicQuantizeLinear"}
    expected, int8, fp32 = run(original, x), run(quantized, x), run(derived, x)
    # Only the weights' rounding is left: the derived graph is closer to the original than the
    # int8 graph (which also rounds every activation) is.
    assert np.abs(fp32 - expected).mean() < 0.05 * np.abs(expected).mean()
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


def test_the_gemm_graph_computes_the_original_model_with_int8_weights(models):
    original, quantized, derived, x = models

    assert gemm_convs(quantized, derived) == 3

    model = onnx.load(str(derived))
    ops = [node.op_type for node in model.graph.node]
    assert "ConvInteger" not in ops and ops.count("MatMulInteger") == 1 + 3  # the MatMul's, and the convolutions'
    assert "DynamicQuantizeLSTM" in ops  # the rest is the int8 graph's
    products = [node for node in model.graph.node if node.op_type == "MatMulInteger"]
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    conv_weights = [weights[node.input[1]] for node in products if node.input[1].endswith("/weight")]
    assert len(conv_weights) == 3
    assert all(w.dtype == np.int8 and np.abs(w).max() == GEMM_WEIGHT_MAX for w in conv_weights)
    expected, int8, gemm = run(original, x), run(quantized, x), run(derived, x)
    assert gemm.shape == expected.shape
    # The weights are rounded anew (7 bits, per output channel): about as far from the original
    # as the int8 graph is (~3 % of the output's mean), where a wrong tap, pad or stride leaves
    # it ~30 times farther (a dilation of 1 for 2: mean error 0.33 for the int8 graph's 0.007).
    assert np.abs(gemm - expected).mean() < 2 * np.abs(int8 - expected).mean()


@pytest.mark.parametrize("change", ["two-d", "groups"])
def test_a_convolution_the_gemm_rewrite_does_not_know_is_refused_and_nothing_is_written(models, change):
    _, quantized, derived, _ = models
    model = onnx.load(str(quantized))
    conv = next(node for node in model.graph.node if node.op_type == "ConvInteger")
    if change == "groups":
        conv.attribute.append(helper.make_attribute("group", 2))
    else:
        weight = next(i for i in model.graph.initializer if i.name == conv.input[1])
        weight.dims.append(1)  # [Co, Ci, K, 1]: a 2-D kernel
    onnx.save(model, str(quantized))

    with pytest.raises(UnknownPatternError, match="not a 1-D convolution of one group"):
        gemm_convs(quantized, derived)
    assert not derived.exists()
