"""The compiler process (:mod:`edgecv.board.runtime.compiler_process`) with a compiler that
crashes on some programs: one whose source holds the text given as the first argument
aborts the process, as a compiler's failed assertion does. Every other program is
compiled by the device's real compiler."""

from __future__ import annotations

import os
import sys

from edgecv.board.runtime import compiler_process

marker = sys.argv[1]
receive = compiler_process._receive


def receive_or_crash(stream):
    request = receive(stream)
    if marker in request[2]:  # (platform, device, source, options)
        os.abort()
    return request


compiler_process._receive = receive_or_crash
compiler_process.main()
