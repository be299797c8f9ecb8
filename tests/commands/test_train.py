"""rlexp/train.py's process settings: freed memory kept for reuse (glibc's malloc), no page faults."""

from __future__ import annotations

import ctypes
import platform
import resource
import sys

import pytest
import torch

from rlexp.train import keep_freed_memory


def page_faults_of_50_temporaries() -> int:
    """Minor page faults while 50 update-sized temporaries ([96, 128, 64] float32, 3 MiB) are allocated, written
    and freed one after another."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        torch.ones(96, 128, 64)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings (Linux only)"
)
def test_keep_freed_memory_reuses_an_update_sized_temporary_without_page_faults():
    # glibc's mmap threshold at its default, fixed (a mallopt call stops its adjustment, as keep_freed_memory's
    # does): every block is a fresh mmap, faulted in page by page
    ctypes.CDLL(None).mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
    assert page_faults_of_50_temporaries() > 50 * 700  # 768 pages a block
    keep_freed_memory()
    page_faults_of_50_temporaries()  # the heap grows to hold the block
    assert page_faults_of_50_temporaries() < 768  # the same block again, not one block's pages faulted
