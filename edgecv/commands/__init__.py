"""The ``edgecv`` commands that :mod:`edgecv.cli` assembles, one module each: its
``add_parser(sub, common)`` registers the subcommand and its flags, its ``run(args)`` does
the work (``bench``, ``demo`` and ``tune`` keep their modules beside what they drive:
:mod:`edgecv.bench.command`, :mod:`edgecv.demo`, :mod:`edgecv.tuning.command`).

:mod:`.deploy`     ``edgecv deploy``: a model into a package
:mod:`.explain`    what ``deploy --explain`` prints from the package's manifest
:mod:`.run`        ``edgecv run``: a package on images or tensors
:mod:`.devices`    ``edgecv devices``: the OpenCL and CUDA devices here
:mod:`.profiles`   ``edgecv profiles``: the device profiles

A board installs these too (``edgecv run`` there): they keep to Python 3.9 and import the
compiler side only inside ``run`` of the commands that need it.
"""
