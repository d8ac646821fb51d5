"""The board side: what a board installs and runs to execute a deployed package.

Reading a package (its manifest and plan), the device runtime (CPU, OpenCL, CUDA),
images in and detections out, and the errors users catch. Everything here keeps to
Python 3.9 and never imports the compiler side (TVM's compiler, MXNet, the frontends,
lowering, schedules, codegen, pipelines, tuning): tests/test_layering.py and
tests/test_boards.py check both.
"""
