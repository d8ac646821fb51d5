"""Auto-tuning: ``edgecv tune`` and ``edgecv rpc-server``.

=====================  ==============================================================
:mod:`.tasks`          a model's kernels as deploy sees them -> tuning tasks, weighted
:mod:`.builder`        candidates compiled in forked children (no per-build TVM import)
:mod:`.runners`        timing on the device: LLVM, OpenCL (pyopencl), CUDA (refused
                       without a GPU)
:mod:`.search`         defaults measured, then MetaSchedule with the xgboost model
:mod:`.records`        the JSON database on disk; pruned copies for shipping
:mod:`.fleet`          TVM RPC tracker + servers: candidates fanned out to devices
:mod:`.command`        the ``tune`` and ``rpc-server`` commands
=====================  ==============================================================

Deploy reads what this stage writes (:class:`edgecv.schedules.database.TuningDatabase`,
in the folder of the device class, :mod:`edgecv.schedules.device_class`) and imports
nothing from here.
"""
