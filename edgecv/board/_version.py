"""edgecv's version, in a module of its own: the package writer records it in every
manifest, and edgecv/__init__.py (which imports the runtime) re-exports it."""

__version__ = "0.1.0"
