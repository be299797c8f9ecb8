"""rlexp/train.py's process settings: freed memory kept for reuse (glibc's malloc), no page faults."""

from __future__ import annotations

import platform
import resource
import sys

import pytest
import torch

from rlexp.train import keep_freed_memory


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings (Linux only)"
)
def test_keep_freed_memory_reuses_an_update_sized_temporary_without_page_faults():
    keep_freed_memory()
    for _ in range(2):  # 3 MiB: the heap grows (in a fresh process the first block is placed apart, the second where
        torch.ones(96, 128, 64)  # every later one goes)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        torch.ones(96, 128, 64)  # allocated, written, freed: the same block again
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 768  # glibc's defaults trim and fault the block in again: ~6,000 faults here
