"""Frames per second of 1, 2 and 4 sources at once, each a video file played through a
package by ``edgecv.video``: pipelined (decode, inference and postprocessing in stages
of their own, ``--streams`` inferences in flight a source) against the sequential loop
(one frame after another, the demo before issue 54).

    python benchmarks/video_pipeline.py PACKAGE [--video FILE] [--sources 1,2,4]
                                        [--streams N] [--passes N] [--frames N] [--out FILE.md]

Without ``--video`` a clip is written first (``--frames`` 640x480 MJPG frames of crops
moving over scikit-image's photos). For each source count S the package is loaded once
with S x ``--streams`` streams, and S threads each play the file through it; a pass is
every source's whole file, its frames/s all frames over the pass's wall time, and the
pipelined and sequential passes take turns (``--passes`` each; the median is printed,
with the pipelined frames' latency p50/p99 from the start of their decode to the end of
their postprocess). Run it on a quiet machine: the numbers are the machine's as much as
the package's.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import edgecv  # noqa: E402

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")


def write_clip(path: Path, frames: int, size: tuple[int, int] = (640, 480)) -> Path:
    """``frames`` crops moving over scikit-image's photos, as an MJPG .avi."""
    import cv2
    import skimage.data

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, size)
    per_photo = max(1, -(-frames // len(PHOTOS)))
    for i in range(frames):
        photo = np.ascontiguousarray(getattr(skimage.data, PHOTOS[i // per_photo])()[:, :, ::-1])
        h, w = photo.shape[:2]
        ch, cw = h * 3 // 4, w * 3 // 4
        step = (i % per_photo) / max(per_photo - 1, 1)
        x, y = int((w - cw) * step), int((h - ch) * step)
        writer.write(cv2.resize(photo[y : y + ch, x : x + cw], size))
    writer.release()
    return path


def one_pass(model, video: str, sources: int, streams: int, pipelined: bool):
    """Every source's whole file at once: (frames/s, the frames' latencies in s)."""
    counts, latencies, errors = [0] * sources, [], []

    def play(index: int) -> None:
        try:
            with edgecv.video(model, video, streams, pipelined=pipelined) as playing:
                counts[index] = sum(1 for _ in playing)
            latencies.extend(playing.stats.latencies)
        except BaseException as err:  # raised below, in the main thread
            errors.append(err)

    threads = [threading.Thread(target=play, args=(i,)) for i in range(sources)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts) / wall, latencies


def measure(package: str, video: str, sources: int, streams: int, passes: int) -> dict:
    model = edgecv.load(package, streams=sources * streams)
    one_pass(model, video, sources, streams, True)  # warm: caches, kept threads
    rates = {"pipelined": [], "sequential": []}
    latencies = {"pipelined": [], "sequential": []}
    for _ in range(passes):
        for name in rates:
            rate, seconds = one_pass(model, video, sources, streams, name == "pipelined")
            rates[name].append(rate)
            latencies[name].extend(seconds)
    row = {"sources": sources}
    for name in rates:
        row[name] = float(np.median(rates[name]))
        row[f"{name}_p50_ms"] = float(np.percentile(latencies[name], 50)) * 1e3
        row[f"{name}_p99_ms"] = float(np.percentile(latencies[name], 99)) * 1e3
    row["ratio"] = row["pipelined"] / row["sequential"]
    return row


def table(rows: list[dict], streams: int) -> list[str]:
    lines = [
        f"| sources | pipelined frames/s ({streams} in flight a source) | sequential frames/s "
        "| pipelined / sequential | pipelined latency p50 / p99 ms | sequential p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['sources']} | {r['pipelined']:.1f} | {r['sequential']:.1f} | "
            f"{r['ratio']:.2f}x | {r['pipelined_p50_ms']:.1f} / {r['pipelined_p99_ms']:.1f} | "
            f"{r['sequential_p50_ms']:.1f} / {r['sequential_p99_ms']:.1f} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", help="package folder or .tar.gz")
    parser.add_argument("--video", help="a video file (default: a clip written first)")
    parser.add_argument("--sources", default="1,2,4", help="source counts, comma-separated")
    parser.add_argument("--streams", type=int, default=1, help="inferences in flight a source")
    parser.add_argument("--passes", type=int, default=3, help="timed passes of each loop")
    parser.add_argument("--frames", type=int, default=120, help="frames of the written clip")
    parser.add_argument("--out", help="also write the table to this .md file")
    args = parser.parse_args()
    counts = [int(n) for n in args.sources.split(",") if n.strip()]
    with tempfile.TemporaryDirectory(prefix="edgecv-video-bench-") as tmp:
        video = args.video or str(write_clip(Path(tmp) / "clip.avi", args.frames))
        rows = []
        for sources in counts:
            rows.append(measure(args.package, video, sources, args.streams, args.passes))
            print(
                f"{sources} sources: pipelined {rows[-1]['pipelined']:.1f} frames/s, "
                f"sequential {rows[-1]['sequential']:.1f} ({rows[-1]['ratio']:.2f}x)",
                flush=True,
            )
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    header = [
        f"package {args.package}, video {args.video or f'a written clip of {args.frames} frames'}",
        f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"load average {load}; median of {args.passes} passes each, in turns",
        "",
    ]
    text = "\n".join([*header, *table(rows, args.streams)])
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
