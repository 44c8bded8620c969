"""cut_slices: contiguous, open-ended, covering ranges, aligned to the task slots."""

from __future__ import annotations

import itertools

import pytest

from applier.bootstrap.plan import Slice, cut_slices


def _check_cover(slices: list[Slice], blocks: int) -> None:
    assert slices[0].lo is None and slices[-1].hi is None
    assert [s.slice_no for s in slices] == list(range(len(slices)))
    for a, b in itertools.pairwise(slices):
        assert a.hi is not None and a.hi == b.lo  # no gap, no overlap
    inner = [s.lo for s in slices[1:]]
    assert all(0 < x < blocks for x in inner if x is not None)


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("blocks", [1, 5, 100, 54_689, 365_000])
def test_slices_cover_every_block_once(blocks: int, workers: int) -> None:
    slices = cut_slices(blocks, blocks * 8192, 64 * 1024**2, workers)
    _check_cover(slices, blocks)


def test_multi_slice_tables_get_a_multiple_of_the_task_slots() -> None:
    size = 448 * 1024**2  # 7 slices of 64 MB
    assert len(cut_slices(size // 8192, size, 64 * 1024**2)) == 7
    assert len(cut_slices(size // 8192, size, 64 * 1024**2, workers=2)) == 8
    assert len(cut_slices(size // 8192, size, 64 * 1024**2, workers=4)) == 8
    assert len(cut_slices(size // 8192, size, 256 * 1024**2, workers=4)) == 4


def test_small_tables_stay_one_slice() -> None:
    assert cut_slices(10, 81920, 64 * 1024**2, workers=4) == [Slice(0, None, None)]
    # Never more slices than blocks.
    assert len(cut_slices(3, 3 * 8192, 8192, workers=4)) == 3
