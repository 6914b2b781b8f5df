"""Graphs derived from a dynamically quantized (int8) ONNX graph, with the same weights.

Kokoro's packaged model is int8, made by onnxruntime's dynamic quantization: ``MatMulInteger``
with int8 weights and ``ConvInteger`` with uint8 weights. Which graph is fastest depends on the
CPU (BENCHMARKS.md, "Kokoro's variants on this CPU"), so ``pool.backends.cache.tts_variant`` times
them on the machine; this module makes the two it does not ship:

- ``dequantize``: the fp32 graph, for CPUs where int8 kernels are slow;
- ``gemm_convs``: the int8 graph with every 1-D ``ConvInteger`` (uint8 x uint8, which onnxruntime
  runs through a generic im2col and a u8u8 GEMM) turned into an im2col of the quantized input and
  a ``MatMulInteger`` with int8 weights, which onnxruntime fuses into ``MatMulIntegerToFloat`` and
  runs on its faster u8s8 kernels (on a Zen 3 with AVX2 alone, Kokoro ~16 % faster in all).

Both undo the quantizer's patterns (onnxruntime ``quantize_dynamic``):

- ``DynamicQuantizeLinear(x) -> MatMulInteger(xq, Wq, x_zp, w_zp) -> Cast -> Mul(x_scale * w_scale)``;
- ``... ConvInteger(...) [-> Add(int32 bias)] -> Cast -> Mul(x_scale * w_scale)``, the float bias
  found where the quantizer divided it: ``Reshape <- Cast <- Floor <- Div(b, x_scale * w_scale)``;
- ``DynamicQuantizeLSTM``, W and R stored as ``[directions, input, 4H]``;

with ``W = (Wq - w_zp) * w_scale`` (per tensor or per output channel). Nodes left without a use are
pruned. Only the ``onnx`` package is needed; nothing is downloaded.
"""

from dataclasses import dataclass

import numpy as np

# gemm_convs' weights: int8 in [-63, 63], one scale per output channel. Without VNNI, onnxruntime's
# u8s8 kernels add pairs of uint8 x int8 products in int16 (x86 VPMADDUBSW), which saturates past
# 2 x 255 x 127; 7-bit weights keep every pair in range, as onnxruntime's own ``reduce_range`` does
# for this reason (its quantization docs). Measured on Kokoro: full 8-bit weights changed the
# audio ~10x more than 7-bit ones (SNR 0.7 dB against 17.5 dB, both against the int8 graph).
GEMM_WEIGHT_MAX = 63


class UnknownPatternError(ValueError):
    """The graph holds a quantized node whose neighbourhood is not one of the patterns above."""


@dataclass
class _Conv:
    """A quantized convolution found in the graph: its float weight ``[Co, Ci, *kernel]`` and
    bias ``[Co]`` (or None), the nodes it spans (the ``ConvInteger`` first), and the name of its
    float result."""

    weight: np.ndarray
    bias: np.ndarray | None
    spanned: list
    output: str


class _Graph:
    """Lookups over a quantized ONNX model, and the rewrite being built: nodes replaced by a list
    of new nodes (an empty list drops them), new initializers by name."""

    def __init__(self, model):
        self.model = model
        graph = model.graph
        self.initializers = {i.name: i for i in graph.initializer}
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.added = {}
        self.replaced = {}

    def constant(self, name):
        from onnx import numpy_helper

        if name not in self.initializers:
            raise UnknownPatternError(f"{name} is not a constant")
        return numpy_helper.to_array(self.initializers[name])

    def add_constant(self, name, array):
        from onnx import numpy_helper

        if name not in self.added:  # a quantized weight may feed several nodes
            self.added[name] = numpy_helper.from_array(np.ascontiguousarray(array), name)
        return name

    def only_consumer(self, name, op_type):
        users = self.consumers.get(name, [])
        if len(users) != 1 or users[0].op_type != op_type:
            raise UnknownPatternError(f"{name} feeds {[u.op_type for u in users]}, not one {op_type}")
        return users[0]

    def quantizer(self, quantized_name):
        """The ``DynamicQuantizeLinear`` that made ``quantized_name`` (outputs: y, y_scale, y_zero_point)."""
        node = self.producer.get(quantized_name)
        if node is None or node.op_type != "DynamicQuantizeLinear":
            raise UnknownPatternError(f"{quantized_name} does not come from DynamicQuantizeLinear")
        return node

    def weight_scale(self, scales_name):
        """w_scale from ``Mul(x_scale, w_scale)``: the Mul's constant input."""
        mul = self.producer.get(scales_name)
        if mul is None or mul.op_type != "Mul":
            raise UnknownPatternError(f"{scales_name} is not x_scale * w_scale")
        constants = [name for name in mul.input if name in self.initializers]
        if len(constants) != 1:
            raise UnknownPatternError(f"{mul.name} has no single constant scale")
        return self.constant(constants[0])

    def scaled_result(self, integer_output):
        """The ``Cast -> Mul(x_scale * w_scale)`` after an integer product: (cast, mul, w_scale)."""
        cast = self.only_consumer(integer_output, "Cast")
        scale_mul = self.only_consumer(cast.output[0], "Mul")
        scales = next(name for name in scale_mul.input if name != cast.output[0])
        return cast, scale_mul, self.weight_scale(scales)

    def conv(self, node):
        """The ``ConvInteger`` pattern at ``node`` as a _Conv."""
        following = self.consumers.get(node.output[0], [])
        if len(following) != 1 or following[0].op_type not in ("Add", "Cast"):
            raise UnknownPatternError(f"{node.name} feeds {[u.op_type for u in following]}")
        bias, spanned, integer = None, [node], node.output[0]
        if following[0].op_type == "Add":
            add = following[0]
            bias = self._float_bias(next(name for name in add.input if name != node.output[0]))
            spanned.append(add)
            integer = add.output[0]
        cast, scale_mul, w_scale = self.scaled_result(integer)
        wq, w_zp = self.constant(node.input[1]).astype(np.float32), self.constant(node.input[3]).astype(np.float32)
        channel = (-1,) + (1,) * (wq.ndim - 1)  # per output channel, when not per tensor
        weight = (wq - w_zp.reshape(channel if w_zp.ndim else ())) * w_scale.reshape(channel if w_scale.ndim else ())
        return _Conv(weight, bias, spanned + [cast, scale_mul], scale_mul.output[0])

    def _float_bias(self, int_bias_name):
        """The float bias the quantizer turned into ``int_bias_name``:
        ``Reshape <- Cast <- Floor <- Div(bias, scale)``."""
        node = self.producer.get(int_bias_name)
        for op_type in ("Reshape", "Cast", "Floor", "Div"):
            if node is None or node.op_type != op_type:
                raise UnknownPatternError(f"the int32 bias {int_bias_name} is not Reshape(Cast(Floor(Div(bias, scale))))")
            if op_type == "Div":
                return self.constant(node.input[0])
            node = self.producer.get(node.input[0])
        raise AssertionError("unreachable")

    def replace(self, spanned, new_nodes):
        """``spanned[0]`` becomes ``new_nodes``; the rest of ``spanned`` is dropped."""
        self.replaced[id(spanned[0])] = list(new_nodes)
        for node in spanned[1:]:
            self.replaced[id(node)] = []

    def save(self, target):
        """Write the rewritten model to ``target``, its dead nodes and unused weights pruned."""
        import onnx

        graph = self.model.graph
        nodes = [new for node in graph.node for new in self.replaced.get(id(node), [node])]
        nodes = _live(nodes, [o.name for o in graph.output])
        used = {name for node in nodes for name in node.input}
        weights = [i for i in list(graph.initializer) + list(self.added.values()) if i.name in used]
        del graph.node[:]
        graph.node.extend(nodes)
        del graph.initializer[:]
        graph.initializer.extend(weights)
        onnx.checker.check_model(self.model)
        onnx.save(self.model, str(target))


def dequantize(source, target):
    """Write to ``target`` the fp32 graph of the dynamically quantized ONNX file ``source``: every
    quantized MatMul, Conv and LSTM becomes its float op with ``W = (Wq - w_zp) * w_scale``
    (LSTM weights transposed to ONNX's ``[directions, 4H, input]``).

    Returns the number of nodes rewritten per kind, e.g. ``{"MatMul": 148, "Conv": 87, "LSTM": 6}``.
    Raises UnknownPatternError for a quantized node this rewrite does not know (nothing is written).
    """
    import onnx
    from onnx import helper

    graph = _Graph(onnx.load(str(source)))
    counts = {"MatMul": 0, "Conv": 0, "LSTM": 0}
    for node in list(graph.model.graph.node):
        name = node.name or node.output[0]
        if node.op_type == "MatMulInteger":
            cast, scale_mul, w_scale = graph.scaled_result(node.output[0])
            wq, w_zp = graph.constant(node.input[1]).astype(np.float32), graph.constant(node.input[3]).astype(np.float32)
            weight = graph.add_constant(node.input[1] + "_fp32", ((wq - w_zp) * w_scale).astype(np.float32))
            graph.replace([node, cast, scale_mul], [helper.make_node(
                "MatMul", [graph.quantizer(node.input[0]).input[0], weight], [scale_mul.output[0]], name=name + "_fp32")])
            counts["MatMul"] += 1
        elif node.op_type == "ConvInteger":
            conv = graph.conv(node)
            inputs = [graph.quantizer(node.input[0]).input[0],
                      graph.add_constant(node.input[1] + "_fp32", conv.weight.astype(np.float32))]
            if conv.bias is not None:
                inputs.append(graph.add_constant(node.input[1] + "_bias_fp32", conv.bias.astype(np.float32)))
            float_conv = helper.make_node("Conv", inputs, [conv.output], name=name + "_fp32")
            float_conv.attribute.extend(node.attribute)
            graph.replace(conv.spanned, [float_conv])
            counts["Conv"] += 1
        elif node.op_type == "DynamicQuantizeLSTM":
            (x, wq, rq, b, lengths, h0, c0, peepholes, w_scale, w_zp, r_scale, r_zp) = list(node.input) + [""] * (
                12 - len(node.input))

            def weights(quantized, scale, zero_point):  # per direction: [directions, 1, 1]
                q = graph.constant(quantized).astype(np.float32)
                return ((q - graph.constant(zero_point).astype(np.float32).reshape(-1, 1, 1))
                        * graph.constant(scale).reshape(-1, 1, 1)).transpose(0, 2, 1).astype(np.float32)

            inputs = [x, graph.add_constant(wq + "_fp32", weights(wq, w_scale, w_zp)),
                      graph.add_constant(rq + "_fp32", weights(rq, r_scale, r_zp)), b, lengths, h0, c0, peepholes]
            while inputs and not inputs[-1]:
                inputs.pop()
            lstm = helper.make_node("LSTM", inputs, list(node.output), name=name + "_fp32")
            lstm.attribute.extend(node.attribute)
            graph.replace([node], [lstm])
            counts["LSTM"] += 1
    graph.save(target)
    return counts


def gemm_convs(source, target):
    """Write to ``target`` the dynamically quantized ONNX file ``source`` with every ``ConvInteger``
    (1-D, one group) computed as a ``MatMulInteger`` with int8 weights; everything else is kept.

    For a convolution of ``x [N, Ci, T]`` with ``W [Co, Ci, K]`` (dilation d, stride s, pads p0, p1):
    the quantized input is transposed to ``[N, T, Ci]``, padded with its zero point (float 0),
    and its K taps ``[N, T', Ci]`` (slices starting at ``k * d``, step s) concatenated into
    ``[N, T', K * Ci]``; that times ``W`` as ``[K * Ci, Co]``, requantized to int8 in
    ``[-GEMM_WEIGHT_MAX, GEMM_WEIGHT_MAX]`` per output channel, scaled by ``x_scale * w_scale[Co]``,
    plus the bias, transposed back to ``[N, Co, T']``. The activations are quantized as before.

    Returns the number of convolutions rewritten. Raises UnknownPatternError for a quantized
    convolution that is not of this kind or not in the quantizer's pattern (nothing is written).
    """
    import onnx
    from onnx import TensorProto, helper

    graph = _Graph(onnx.load(str(source)))
    count = 0
    for node in list(graph.model.graph.node):
        if node.op_type != "ConvInteger":
            continue
        conv = graph.conv(node)
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if conv.weight.ndim != 3 or attributes.get("group", 1) != 1 or attributes.get("auto_pad", b"NOTSET") != b"NOTSET":
            raise UnknownPatternError(f"{node.name} is not a 1-D convolution of one group with explicit pads")
        (dilation,), (stride,) = attributes.get("dilations", [1]), attributes.get("strides", [1])
        pad_start, pad_end = attributes.get("pads", [0, 0])
        channels_out, channels_in, taps = conv.weight.shape
        scale = np.maximum(np.abs(conv.weight).reshape(channels_out, -1).max(axis=1), 1e-30) / GEMM_WEIGHT_MAX
        weight = np.rint(conv.weight / scale[:, None, None]).astype(np.int8)  # within +-GEMM_WEIGHT_MAX
        weight = weight.transpose(2, 1, 0).reshape(taps * channels_in, channels_out)  # row k * Ci + ci

        prefix = (node.name or node.output[0]) + "_gemm"
        x_quantized, x_zero_point = node.input[0], node.input[2]
        x_scale = graph.quantizer(x_quantized).output[1]

        def constant(suffix, value, prefix=prefix):
            return graph.add_constant(f"{prefix}/{suffix}", np.asarray(value))

        nodes = [helper.make_node("Transpose", [x_quantized], [f"{prefix}/time_major"], perm=[0, 2, 1])]
        columns = f"{prefix}/time_major"
        if pad_start or pad_end:
            nodes.append(helper.make_node("Pad", [columns, constant("pads", np.array([0, pad_start, 0, 0, pad_end, 0])),
                                                  x_zero_point], [f"{prefix}/padded"]))
            columns = f"{prefix}/padded"
        if taps > 1 or stride > 1:
            tap_names = []
            for k in range(taps):
                from_end = (taps - 1 - k) * dilation  # the last tap ends at the end; the others before it
                nodes.append(helper.make_node(
                    "Slice", [columns, constant(f"start{k}", [k * dilation]),
                              constant(f"end{k}", [-from_end if from_end else np.iinfo(np.int64).max]),
                              constant("axis", [1]), constant("step", [stride])], [f"{prefix}/tap{k}"]))
                tap_names.append(f"{prefix}/tap{k}")
            if taps > 1:
                nodes.append(helper.make_node("Concat", tap_names, [f"{prefix}/columns"], axis=2))
                columns = f"{prefix}/columns"
            else:
                columns = tap_names[0]
        nodes += [
            helper.make_node("MatMulInteger", [columns, constant("weight", weight), x_zero_point], [f"{prefix}/int32"]),
            helper.make_node("Cast", [f"{prefix}/int32"], [f"{prefix}/float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [x_scale, constant("w_scale", scale.astype(np.float32))], [f"{prefix}/scale"]),
            helper.make_node("Mul", [f"{prefix}/float", f"{prefix}/scale"], [f"{prefix}/scaled"]),
        ]
        result = f"{prefix}/scaled"
        if conv.bias is not None:
            nodes.append(helper.make_node("Add", [result, constant("bias", conv.bias.astype(np.float32))],
                                          [f"{prefix}/biased"]))
            result = f"{prefix}/biased"
        nodes.append(helper.make_node("Transpose", [result], [conv.output], perm=[0, 2, 1]))
        graph.replace(conv.spanned, nodes)
        count += 1
    graph.save(target)
    return count


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
