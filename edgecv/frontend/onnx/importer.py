"""ONNX model -> Relax IRModule, through TVM's ``relax.frontend.onnx``.

Checked before anything is converted, in the order a user needs the answers: the opset,
every operator (one error naming all without a converter), the input shapes. Weights
become constants bound in the module (as the MXNet importer binds its parameters), so
later passes fold them; then :mod:`.normalize` rewrites the few forms TVM's converters
write that edgecv's pipeline reads in another.
"""

from __future__ import annotations

import warnings

import tvm
from tvm import relax

from ...board.errors import ConversionError, EdgecvError, foreign_message
from ...op_registry import RegisteredOp
from ..imported import ImportedModel, check_input_shapes
from ..registered import emit_registered
from .converters import CONVERTERS
from .graph_inputs import graph_inputs, static_shapes
from .model_file import check_opset
from .normalize import normalize
from .ops import check_rewritten, registered_ops
from .qdq import strip_qdq
from .torchvision_detection import rewrite as rewrite_detections
from .ultralytics_nms import rewrite as rewrite_ultralytics_nms
from .vision import check_nms_readers


def from_onnx(
    model,
    input_shapes: tuple[int, ...] | dict[str, tuple[int, ...]] | None = None,
    source: str = "the ONNX model",
) -> ImportedModel:
    """Convert an ONNX model to a Relax module.

    Parameters
    ----------
    model : onnx.ModelProto
        The model with its weights in memory (:func:`.model_file.load_model`).
    input_shapes : tuple or dict, optional
        Static shapes for inputs the graph leaves symbolic: one shape for a one-input
        model, or a shape by input name. Inputs not given keep the graph's shape.
    source : str
        How errors name the model (its file).

    Returns
    -------
    ImportedModel
        The module (``main`` takes the inputs in graph order) and its signature, inputs
        and outputs named as in the graph.
    """
    opset = check_opset(model, source)
    model, quantization = strip_qdq(model, source)  # a QDQ model: float graph + its scales
    registered = registered_ops(model)
    model = rewrite_detections(model, source)
    model = rewrite_ultralytics_nms(model, source)
    check_nms_readers(model, source)
    check_rewritten(model, source)
    inputs = graph_inputs(model)
    shapes = check_input_shapes(static_shapes(inputs, input_shapes, source))
    dtypes = {i.name: i.dtype for i in inputs}
    importer = _importer_class()(registered, {n: list(s) for n, s in shapes.items()}, dtypes)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # renames, unknown dims: checked above
            mod = importer.from_onnx(model.graph, opset)
    except EdgecvError:
        raise
    except Exception as err:  # TVM raises many kinds for a node it cannot convert
        raise ConversionError(
            f"{source}: TVM's ONNX frontend failed to convert the graph: "
            f"{foreign_message(err, 300)}"
        ) from None
    mod = normalize(mod)
    main = mod["main"]
    outputs = main.ret_ty.fields if isinstance(main.ret_ty, relax.TupleType) else [main.ret_ty]
    output_shapes = []
    for name, ty in zip([o.name for o in model.graph.output], outputs, strict=True):
        if ty.shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape):
            raise ConversionError(
                f"{source}: output `{name}` has a shape known only at run time "
                f"({ty.shape}); edgecv deploys models whose outputs have static shapes"
            )
        output_shapes.append(tuple(int(d) for d in ty.shape))
    return ImportedModel(
        mod=mod,
        input_names=list(shapes),
        input_shapes=shapes,
        input_dtypes={n: dtypes[n] for n in shapes},
        output_names=[o.name for o in model.graph.output],
        output_shapes=output_shapes,
        output_dtypes=[str(ty.dtype) for ty in outputs],
        quantization=quantization,
    )


def _python_attrs(attrs: dict) -> dict:
    """A node's attributes as TVM's importer parsed them, as Python values for a
    registered operator: strings decoded, tensors as arrays, lists as lists."""
    import onnx

    def value(v):
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, onnx.TensorProto):
            return onnx.numpy_helper.to_array(v)
        if isinstance(v, tuple):
            return [value(x) for x in v]
        return v

    return {k: value(v) for k, v in attrs.items() if k != "tvm_custom"}


def _importer_class():
    """TVM's graph importer, with registered operators converted by edgecv (the class is
    made on first use, so importing this module does not import onnx)."""
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    class Importer(ONNXGraphImporter):
        def __init__(self, registered: dict[str, RegisteredOp], shapes: dict, dtypes: dict):
            super().__init__(shapes, dtypes, keep_params_in_input=False, sanitize=False)
            self._registered = registered

        def _check_for_unsupported_ops(self, graph) -> None:
            """Checked already, registered operators included (:func:`.ops.registered_ops`)."""

        def _convert_operator(self, op_name, inputs, attrs, opset):
            op = self._registered.get(op_name)
            if op is None:
                own = CONVERTERS.get(op_name)
                converted = own(self.bb, inputs, attrs, opset) if own else None
                if converted is not None:
                    return self.bb.normalize(converted)
                return super()._convert_operator(op_name, inputs, attrs, opset)
            name = attrs["tvm_custom"]["name"] or op_name
            given = [x for x in inputs if x is not None]
            return emit_registered(self.bb, op, given, _python_attrs(attrs), name)

    return Importer
