"""OpenVINO's async pipeline over a video file, for ``edgecv bench --video FILE --vs
openvino``: the way OpenVINO's object-detection demo runs (``-nireq``), frames decoded
and preprocessed in one thread and handed to an ``AsyncInferQueue`` of N infer requests
(N = ``--streams``), each result postprocessed in OpenVINO's callback as it completes.
The frames, the preprocessing (the package's) and the postprocessing (the package's
decoder) are edgecv's, so the runs differ in how inference is driven and by whom."""

from __future__ import annotations

import threading
import time

import numpy as np

from ..board.frames import open_source


class OpenVINOVideo:
    """Passes over a video file through an OpenVINO compiled model's async requests."""

    def __init__(self, compiled, requests: int, model):
        import openvino as ov

        self.queue = ov.AsyncInferQueue(compiled, requests)
        self.outputs = compiled.outputs
        self.model = model  # edgecv's package: its preprocessing and decoder
        self.latencies: list[float] = []
        self.first: list[np.ndarray] | None = None  # the first frame's outputs
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.queue.set_callback(self._finished)

    def _finished(self, request, userdata) -> None:
        index, start, image_hw = userdata
        try:
            outputs = [np.array(request.get_tensor(o).data) for o in self.outputs]
            self.model.decode(outputs, image_hw)
            with self._lock:
                self.latencies.append(time.perf_counter() - start)
                if index == 0 and self.first is None:
                    self.first = outputs
        except BaseException as err:  # raised by run_pass, in the caller's thread
            self.errors.append(err)

    def run_pass(self, path: str) -> float:
        """One pass over the file: frames per second, decode to postprocessed."""
        frames = open_source(path).frames()
        count, begin = 0, time.perf_counter()
        while True:
            start = time.perf_counter()
            frame = next(frames, None)
            if frame is None:
                break
            x = self.model.preprocess(frame)
            self.queue.start_async({0: x}, (count, start, frame.shape[:2]))
            count += 1
        self.queue.wait_all()
        if self.errors:
            raise self.errors[0]
        return count / (time.perf_counter() - begin)
