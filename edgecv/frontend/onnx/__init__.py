"""ONNX file -> Relax: TVM's ``relax.frontend.onnx`` behind edgecv's own checks (the
file, its opset, its operators, its input shapes), ending in the same
:class:`~edgecv.frontend.imported.ImportedModel` the MXNet importer returns."""
