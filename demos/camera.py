"""Camera demo: ``edgecv demo`` under its old name.

    python demos/camera.py PACKAGE                          # camera 0, in a window
    python demos/camera.py PACKAGE --video clip.mp4
    python demos/camera.py PACKAGE --images frames/ --headless -o annotated.mp4

Every option is ``edgecv demo``'s (``edgecv demo --help``).
"""

from __future__ import annotations

import sys

from edgecv.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
