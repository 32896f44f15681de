"""An autouse fixture for test modules of the 16-bit-x Q8_0 and Q5_0 kernels: import it into the module
(`from tests.fp32_x import fp32_x_q8_0_and_q5_0  # noqa: F401`) and its tests run with Q8_0 and Q5_0
off STRATA_INT8_X's default list, so that a 16-bit x without a config reaches those kernels."""

import pytest


@pytest.fixture(autouse=True)
def fp32_x_q8_0_and_q5_0(monkeypatch):
    monkeypatch.setenv("STRATA_INT8_X", "Q4_K+Q6_K")
