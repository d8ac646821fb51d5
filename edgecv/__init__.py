"""edgecv: deploy GluonCV/MXNet vision models to integrated GPUs and CPUs with Apache TVM."""

__version__ = "0.1.0"


def load(path):
    """Load a deployed package; see :func:`edgecv.model.load`."""
    from .model import load as _load

    return _load(path)
