"""An fp32 ONNX graph from a dynamically quantized (int8) one, with the same weights.

Kokoro's packaged model is int8, made by onnxruntime's dynamic quantization. On a CPU with
AVX-512 VNNI its ``MatMulInteger`` / ``ConvInteger`` kernels are faster than fp32; on an AVX2-only
CPU they are up to 2x slower (docs/MODELS.md, "Kokoro int8 or fp32"). Which is faster is measured
on the machine (``pool.backends.cache.choose_tts_variant``); this module makes the other one.

The rewrite undoes the quantizer's patterns (onnxruntime ``quantize_dynamic``):

- ``DynamicQuantizeLinear(x) -> MatMulInteger(xq, Wq, x_zp, w_zp) -> Cast -> Mul(x_scale * w_scale)``
  becomes ``MatMul(x, W)``;
- ``... ConvInteger(...) [-> Add(int32 bias)] -> Cast -> Mul(x_scale * w_scale)`` becomes
  ``Conv(x, W, b)``, the float bias found where the quantizer divided it:
  ``Reshape <- Cast <- Floor <- Div(b, x_scale * w_scale)``;
- ``DynamicQuantizeLSTM`` becomes ``LSTM``, W and R transposed from ``[directions, input, 4H]`` to
  ONNX's ``[directions, 4H, input]``;

with ``W = (Wq - w_zp) * w_scale`` (per tensor or per output channel). Nodes left without a use are
pruned. Only the ``onnx`` package is needed; nothing is downloaded.
"""

import numpy as np


class UnknownPatternError(ValueError):
    """The graph holds a quantized node whose neighbourhood is not one of the patterns above."""


def dequantize(source, target):
    """Write to ``target`` the fp32 graph of the dynamically quantized ONNX file ``source``.

    Returns the number of nodes rewritten per kind, e.g. ``{"MatMul": 148, "Conv": 87, "LSTM": 6}``.
    Raises UnknownPatternError for a quantized node this rewrite does not know (nothing is written).
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    added_weights = {}  # name -> TensorProto; a quantized weight may feed several nodes
    replaced = {}  # id of a node to drop -> the node that takes its place (None: just drop)
    counts = {"MatMul": 0, "Conv": 0, "LSTM": 0}

    def constant(name):
        if name not in initializers:
            raise UnknownPatternError(f"{name} is not a constant")
        return numpy_helper.to_array(initializers[name])

    def only_consumer(name, op_type):
        users = consumers.get(name, [])
        if len(users) != 1 or users[0].op_type != op_type:
            raise UnknownPatternError(f"{name} feeds {[u.op_type for u in users]}, not one {op_type}")
        return users[0]

    def weight_scale(scales_name):
        """w_scale from ``Mul(x_scale, w_scale)``: the Mul's constant input."""
        mul = producer.get(scales_name)
        if mul is None or mul.op_type != "Mul":
            raise UnknownPatternError(f"{scales_name} is not x_scale * w_scale")
        constants = [name for name in mul.input if name in initializers]
        if len(constants) != 1:
            raise UnknownPatternError(f"{mul.name} has no single constant scale")
        return constant(constants[0])

    def float_input(quantized_name):
        quantizer = producer.get(quantized_name)
        if quantizer is None or quantizer.op_type != "DynamicQuantizeLinear":
            raise UnknownPatternError(f"{quantized_name} does not come from DynamicQuantizeLinear")
        return quantizer.input[0]

    def add_weight(name, array):
        if name not in added_weights:
            added_weights[name] = numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name)
        return name

    for node in graph.node:
        if node.op_type == "MatMulInteger":
            cast = only_consumer(node.output[0], "Cast")
            scale_mul = only_consumer(cast.output[0], "Mul")
            scales = next(name for name in scale_mul.input if name != cast.output[0])
            wq, w_zp = constant(node.input[1]).astype(np.float32), constant(node.input[3]).astype(np.float32)
            w = (wq - w_zp) * weight_scale(scales)  # per-column zero point and scale broadcast over rows
            weight = add_weight(node.input[1] + "_fp32", w)
            replaced[id(node)] = helper.make_node("MatMul", [float_input(node.input[0]), weight],
                                                  [scale_mul.output[0]], name=(node.name or node.output[0]) + "_fp32")
            replaced[id(cast)] = replaced[id(scale_mul)] = None
            counts["MatMul"] += 1
        elif node.op_type == "ConvInteger":
            following = consumers.get(node.output[0], [])
            if len(following) != 1 or following[0].op_type not in ("Add", "Cast"):
                raise UnknownPatternError(f"{node.name} feeds {[u.op_type for u in following]}")
            bias = None
            if following[0].op_type == "Add":
                add = following[0]
                bias = _float_bias(next(name for name in add.input if name != node.output[0]), producer, constant)
                replaced[id(add)] = None
                cast = only_consumer(add.output[0], "Cast")
            else:
                cast = following[0]
            scale_mul = only_consumer(cast.output[0], "Mul")
            scales = next(name for name in scale_mul.input if name != cast.output[0])
            wq, w_zp = constant(node.input[1]).astype(np.float32), constant(node.input[3]).astype(np.float32)
            w_scale = weight_scale(scales)
            channel = (-1,) + (1,) * (wq.ndim - 1)  # per output channel, when not per tensor
            w = (wq - w_zp.reshape(channel if w_zp.ndim else ())) * w_scale.reshape(channel if w_scale.ndim else ())
            inputs = [float_input(node.input[0]), add_weight(node.input[1] + "_fp32", w)]
            if bias is not None:
                inputs.append(add_weight(node.input[1] + "_bias_fp32", bias))
            conv = helper.make_node("Conv", inputs, [scale_mul.output[0]], name=(node.name or node.output[0]) + "_fp32")
            conv.attribute.extend(node.attribute)
            replaced[id(node)] = conv
            replaced[id(cast)] = replaced[id(scale_mul)] = None
            counts["Conv"] += 1
        elif node.op_type == "DynamicQuantizeLSTM":
            (x, wq, rq, b, lengths, h0, c0, peepholes, w_scale, w_zp, r_scale, r_zp) = list(node.input) + [""] * (
                12 - len(node.input))
            def weights(quantized, scale, zero_point):  # per direction: [directions, 1, 1]
                q = constant(quantized).astype(np.float32)
                return ((q - constant(zero_point).astype(np.float32).reshape(-1, 1, 1))
                        * constant(scale).reshape(-1, 1, 1)).transpose(0, 2, 1)

            inputs = [x, add_weight(wq + "_fp32", weights(wq, w_scale, w_zp)),
                      add_weight(rq + "_fp32", weights(rq, r_scale, r_zp)), b, lengths, h0, c0, peepholes]
            while inputs and not inputs[-1]:
                inputs.pop()
            lstm = helper.make_node("LSTM", inputs, list(node.output), name=(node.name or node.output[0]) + "_fp32")
            lstm.attribute.extend(node.attribute)
            replaced[id(node)] = lstm
            counts["LSTM"] += 1

    nodes = [replaced.get(id(node), node) for node in graph.node]
    nodes = _live([n for n in nodes if n is not None], [o.name for o in graph.output])
    used = {name for node in nodes for name in node.input}
    weights = [i for i in list(graph.initializer) + list(added_weights.values()) if i.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(weights)
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return counts


def _float_bias(int_bias_name, producer, constant):
    """The float bias the quantizer turned into ``int_bias_name``:
    ``Reshape <- Cast <- Floor <- Div(bias, scale)``."""
    node = producer.get(int_bias_name)
    for op_type in ("Reshape", "Cast", "Floor", "Div"):
        if node is None or node.op_type != op_type:
            raise UnknownPatternError(f"the int32 bias {int_bias_name} is not Reshape(Cast(Floor(Div(bias, scale))))")
        if op_type == "Div":
            return constant(node.input[0])
        node = producer.get(node.input[0])
    raise AssertionError("unreachable")


def _live(nodes, outputs):
    """``nodes`` that an output of the graph depends on, in their order (the rest are dead)."""
    producer = {out: node for node in nodes for out in node.output}
    needed, stack = set(), list(outputs)
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            stack.extend(name for name in node.input if name)
    return [node for node in nodes if id(node) in needed]
