"""benchmarks/admission.py (issue 54): each variant's child drives its requests as the benchmark counts them,
and every request is admitted and answered (the child checks it), so the counts are of admissions."""

from __future__ import annotations

import pytest

from benchmarks import admission


@pytest.mark.parametrize("variant", admission.VARIANTS)
@pytest.mark.parametrize("frames", [0, 3])
def test_each_variant_admits_every_request(variant: str, frames: int) -> None:
    admission.child(variant, frames, 5)


def test_the_fits_variant_reads_a_body_with_a_limit() -> None:
    assert b'"max_tokens": 64' in admission.BODY
    assert (b"content-length", b"%d" % len(admission.BODY)) in admission.HEADERS
