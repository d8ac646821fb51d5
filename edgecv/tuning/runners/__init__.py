"""Runners: how candidates are built for, and timed on, each kind of device.

==========  ===================================================================
``llvm``    :mod:`.llvm`: shared libraries timed by TVM's ``time_evaluator``
``opencl``  :mod:`.opencl`: deploy's lowering and launch recording, one OpenCL
            program per batch of candidates, timed by OpenCL event profiling
``cuda``    :mod:`.cuda`: refused without a CUDA GPU on this machine
==========  ===================================================================
"""
