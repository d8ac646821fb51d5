"""The tolerance helpers of edgecv.testing against forward passes whose conditioning is
known: loosening follows the reference's own drift under rounding-level noise."""

from __future__ import annotations

import numpy as np

from edgecv.testing import TOLERANCES, rounding_loosening


def test_a_well_conditioned_reference_keeps_the_table():
    x = np.random.RandomState(0).uniform(1, 2, (4, 8)).astype(np.float32)
    assert rounding_loosening(lambda a: [a * 2, np.tanh(a)], [x]) == [1.0, 1.0]


def test_a_reference_that_amplifies_rounding_loosens_by_its_own_drift():
    x = np.random.RandomState(0).uniform(1, 2, (4, 8)).astype(np.float32)

    def cancelling(a):  # the difference of two large, nearly equal terms: 1e3x the noise
        return [(a.astype(np.float64) * 1e3 - np.floor(a * 1e3)).astype(np.float32), a]

    wide, plain = rounding_loosening(cancelling, [x])
    _, atol = TOLERANCES["float32"]
    assert plain == 1.0
    # inputs moved by ~1e-7 move the output by ~1e-4 of its scale (about 1): 4x that
    assert 4 * 1e-5 / atol < wide < 4 * 1e-3 / atol


def test_integer_outputs_stay_exact():
    x = np.arange(6, dtype=np.float32)
    assert rounding_loosening(lambda a: [np.argsort(-a)], [x]) == [1.0]
