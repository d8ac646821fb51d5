"""``edgecv demo --headless`` on a video and a folder of images the test makes from
scikit-image's photos: the mp4 it writes opens, has every frame at the right size,
and shows the detector's boxes where MXNet says they are."""

from __future__ import annotations

import os

import cv2
import numpy as np
import skimage.data
from helpers import assert_one_error_line, cli_here, run_cli

from edgecv._mxnet import import_mxnet

mx = import_mxnet()
S = mx.sym
SIZE = 64  # the tiny detector's input
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket"]


def tiny_detector():
    """SSD's tail without parameters: one box per image whose corners follow the image's
    mean colour, scored 0.9, through box_nms; outputs ids, scores, boxes like GluonCV's."""
    d = S.var("data")
    mean = S.reshape(S.Pooling(d, kernel=(1, 1), global_pool=True, pool_type="avg"), (1, 1, 3))
    level = S.clip(S.slice_axis(mean, axis=2, begin=0, end=1), -2, 2)  # (1, 1, 1)
    zero = level * 0
    x1 = zero + 8 + level * 2
    rows = S.concat(zero, zero + 0.9, x1, zero + 10, x1 + 30, zero + 50, dim=2)
    nms = S.contrib.box_nms(
        rows, overlap_thresh=0.5, topk=1, id_index=0, score_index=1, coord_start=2
    )
    ids = S.slice_axis(nms, axis=2, begin=0, end=1)
    scores = S.slice_axis(nms, axis=2, begin=1, end=2)
    boxes = S.slice_axis(nms, axis=2, begin=2, end=6)
    return S.Group([ids, scores, boxes])


def photos(size=(160, 120)):
    return [cv2.resize(getattr(skimage.data, n)()[:, :, ::-1], size) for n in PHOTOS]


def expected_box(frame):
    """The box MXNet computes for ``frame``, in frame pixels (the reference)."""
    from edgecv.frontend.mxnet.zoo import MEAN_RGB, STD_RGB

    rgb = cv2.resize(frame, (SIZE, SIZE))[:, :, ::-1].astype(np.float32) / 255
    x = ((rgb - np.float32(MEAN_RGB)) / np.float32(STD_RGB)).transpose(2, 0, 1)[None]
    exe = tiny_detector().bind(mx.cpu(), {"data": mx.nd.array(x)})
    box = exe.forward()[2].asnumpy().reshape(4)
    sy, sx = frame.shape[0] / SIZE, frame.shape[1] / SIZE
    return box * np.array([sx, sy, sx, sy])


def read_video(path) -> list[np.ndarray]:
    capture = cv2.VideoCapture(str(path))
    assert capture.isOpened()
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    read = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        read.append(frame)
    assert len(read) == count
    return read


def check_box_and_fps(shown, box, before):
    """The box's left edge is drawn in the box colour (0, 200, 255) BGR where ``before``
    (the photo, as fitted into the frame) was not; the frame rate is green text on black
    in the top-left corner (codec noise aside)."""
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    edge = shown[y1 + 2 : y2 - 2, x1].astype(int)
    assert np.abs(edge - (0, 200, 255)).max(axis=1).mean() < 60, (x1, y1, x2, y2)
    was = before[y1 + 2 : y2 - 2, x1].astype(int)
    assert np.abs(was - (0, 200, 255)).max(axis=1).mean() > 60  # not there before
    corner = shown[4:22, 4:60].astype(int)
    green = (corner[..., 1] > 150) & (corner[..., 0] < 100) & (corner[..., 2] < 100)
    assert green.sum() > 20 and np.median(corner) < 60, "no FPS overlay"


def check_video(path, frames):
    read = read_video(path)
    assert len(read) == len(frames)
    for original, shown in zip(frames, read, strict=True):
        assert shown.shape == original.shape
        check_box_and_fps(shown, expected_box(original), original)


def write_clip(path, frames) -> list[np.ndarray]:
    """``frames`` as an mp4 at ``path``; returns them as the decoder reads them back
    (the mp4 is lossy: compare with those)."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 5, (160, 120))
    for frame in frames:
        writer.write(frame)
    writer.release()
    capture = cv2.VideoCapture(str(path))
    return [capture.read()[1] for _ in frames]


def test_demo_on_a_video(detector_package, tmp_path):
    frames = photos()
    video = tmp_path / "clip.mp4"
    decoded = write_clip(video, frames)
    out = tmp_path / "annotated.mp4"
    result = run_cli("demo", detector_package, "--video", video, "--headless", "-o", out)
    assert result.returncode == 0, result.stderr
    latencies = [line for line in result.stdout.splitlines() if line.startswith("frame ")]
    assert len(latencies) == len(frames) and all(" ms " in line for line in latencies)
    check_video(out, decoded)


def test_demo_on_an_image_folder(detector_package, tmp_path, capfd):
    folder = tmp_path / "images"
    folder.mkdir()
    frames = photos()
    for i, frame in enumerate(frames):
        cv2.imwrite(str(folder / f"{i:02d}.png"), frame)
    out = tmp_path / "annotated.mp4"
    result = cli_here(capfd, "demo", detector_package, "--images", folder, "--headless", "-o", out)
    assert result.returncode == 0, result.stderr
    check_video(out, frames)


def test_demo_plays_several_sources_at_once(detector_package, tmp_path, capfd):
    """A video and a folder of images in one run: each plays in its own thread through
    the one loaded model (a stream each) and gets its own annotated video, right."""
    video = tmp_path / "clip.mp4"
    decoded = write_clip(video, photos())
    folder = tmp_path / "images"
    folder.mkdir()
    stills = photos()[::-1][:3]
    for i, frame in enumerate(stills):
        cv2.imwrite(str(folder / f"{i:02d}.png"), frame)
    out = tmp_path / "annotated.mp4"
    result = cli_here(
        capfd,
        "demo",
        detector_package,
        "--video",
        video,
        "--images",
        folder,
        "--headless",
        "-o",
        out,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("2 sources, a stream each (1: video ")
    assert sum(line.startswith("source 1 frame ") for line in lines) == len(decoded), lines
    assert sum(line.startswith("source 2 frame ") for line in lines) == len(stills)
    assert not out.exists()
    check_video(tmp_path / "annotated-1.mp4", decoded)
    check_video(tmp_path / "annotated-2.mp4", stills)
    # one source that fails ends the run with its one error line
    assert_one_error_line(
        cli_here(
            capfd,
            "demo",
            detector_package,
            "--video",
            video,
            "--video",
            tmp_path / "none.mp4",
            "--headless",
            "-o",
            tmp_path / "c.mp4",
        ),
        "does not exist",
    )


def test_demo_fits_photos_of_other_sizes_into_the_video(detector_package, tmp_path, capfd):
    folder = tmp_path / "mixed"
    folder.mkdir()
    sizes = [(160, 120), (120, 160), (400, 300)]  # the first photo sets the video's size
    frames = [
        cv2.resize(getattr(skimage.data, n)()[:, :, ::-1], s)
        for n, s in zip(PHOTOS, sizes, strict=False)
    ]
    for i, frame in enumerate(frames):
        cv2.imwrite(str(folder / f"{i:02d}.png"), frame)
    out = tmp_path / "mixed.mp4"
    result = cli_here(capfd, "demo", detector_package, "--images", folder, "--headless", "-o", out)
    assert result.returncode == 0, result.stderr
    read = read_video(out)
    assert [f.shape for f in read] == [(120, 160, 3)] * 3  # none dropped
    for original, shown in zip(frames, read, strict=True):
        h, w = original.shape[:2]
        scale = min(160 / w, 120 / h)
        left, top = (160 - round(w * scale)) // 2, (120 - round(h * scale)) // 2
        fitted = np.zeros_like(shown)
        fitted[top : top + round(h * scale), left : left + round(w * scale)] = cv2.resize(
            original, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA
        )
        box = expected_box(original) * scale + np.array([left, top, left, top])
        check_box_and_fps(shown, box, fitted)  # boxes and text drawn after fitting
    assert read[1][60:, 130:].max() < 40  # the portrait photo: black bars (under its label)


def test_demo_errors(detector_package, tmp_path, capfd):
    assert_one_error_line(
        cli_here(
            capfd,
            "demo",
            detector_package,
            "--images",
            tmp_path,
            "--headless",
            "-o",
            tmp_path / "a.mp4",
        ),
        "no .jpg/.png/.bmp images",
    )
    assert_one_error_line(
        cli_here(
            capfd,
            "demo",
            detector_package,
            "--video",
            tmp_path / "none.mp4",
            "--headless",
            "-o",
            tmp_path / "b.mp4",
        ),
        "does not exist",
    )
    assert_one_error_line(cli_here(capfd, "demo", detector_package, "--headless"), "needs -o")


def test_demo_pipelined_and_sequential_show_the_same_frames(detector_package, tmp_path, capfd):
    """``--streams 2`` (two inferences in flight) and ``--sequential`` (one frame after
    another) write the same annotated frames; each prints a line per frame with its
    stage times and a summary line with the frames/s, drops and latency percentiles."""
    video = tmp_path / "clip.mp4"
    decoded = write_clip(video, photos())
    for flags in (["--streams", "2"], ["--sequential"]):
        out = tmp_path / f"annotated{flags[0]}.mp4"
        argv = ["demo", detector_package, "--video", video, "--headless", "-o", out, *flags]
        result = cli_here(capfd, *argv)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        frames = [line for line in lines if line.startswith("frame ")]
        assert [line.split(":")[0] for line in frames] == [f"frame {i + 1}" for i in range(4)]
        assert all("decode " in line and "latency " in line for line in frames)
        summary = [line for line in lines if line.startswith(f"video {video}: ")]
        assert len(summary) == 1 and f"{len(decoded)} frames, " in summary[0], lines
        assert "0 dropped" in summary[0] and "p99" in summary[0]
        check_video(out, decoded)
        for shown, original in zip(read_video(out), decoded, strict=True):
            # the stage times: white text on black under the frame rate
            stats, before = shown[28:50, 6:60].astype(int), original[28:50, 6:60].astype(int)
            white, black = (stats.min(axis=2) > 170).sum(), (stats.max(axis=2) < 40).mean()
            was = (before.max(axis=2) < 40).mean()
            assert white > 15 and black > 0.2 and black > 2 * was, (white, black, was)
    assert_one_error_line(
        cli_here(capfd, "demo", detector_package, "--video", video, "--streams", "0"),
        "--streams 0",
    )


def test_ctrl_c_stops_every_source_and_keeps_what_was_written(detector_package, tmp_path):
    """SIGINT once frames flow: each source stops, its video is closed with the frames it
    printed, its summary line is there, no traceback (a hang fails the wait's limit)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    video = tmp_path / "long.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 30, (160, 120))
    stills = photos()
    for i in range(3000):  # far more than play before the signal
        writer.write(stills[i % len(stills)])
    writer.release()
    out = tmp_path / "a.mp4"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    argv = ["demo", detector_package, "--video", video, "--video", video, "--headless"]
    process = subprocess.Popen(
        [sys.executable, "-m", "edgecv.cli", *map(str, argv), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not ignored
    )
    lines = [process.stdout.readline()]
    while lines[-1] and " frame 5:" not in lines[-1]:
        lines.append(process.stdout.readline())
    process.send_signal(signal.SIGINT)
    rest, err = process.communicate(timeout=120)
    lines += rest.splitlines()
    assert process.returncode == 0 and "Traceback" not in err, err
    for source in (1, 2):
        printed = sum(line.startswith(f"source {source} frame ") for line in lines)
        written = len(read_video(tmp_path / f"a-{source}.mp4"))
        assert 0 < written == printed < 3000
        assert f"wrote {tmp_path / f'a-{source}.mp4'} ({written} frames)" in lines
        summary = [line for line in lines if line.startswith(f"source {source} video ")]
        assert len(summary) == 1 and f": {written} frames, " in summary[0], lines[-6:]
