"""The allocator settings of fixtures/engine/memory.py: glibc takes them (mallopt answers 1 for
each), and a large block freed and allocated again then stays in the process instead of being
unmapped and mapped afresh (the page faults that cost the specification curve CPU time)."""

import ctypes
import os
import platform
import resource

import pytest

from fixtures.engine.memory import MALLOC_ENV, release_freed_memory, reuse_large_blocks

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt and malloc_trim are glibc's")
def test_glibc_takes_the_settings_and_a_freed_large_block_is_reused(monkeypatch):
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    size = 64 << 20  # above glibc's default mmap threshold (dynamic, at most 32 MiB)

    def minor_faults_of_three_blocks() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            block = libc.malloc(size)
            assert block
            libc.memset(block, 1, size)  # touch every page
            libc.free(block)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    pages = size // resource.getpagesize()
    for name in MALLOC_ENV:  # unset, and put back as it was after the test
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
    assert reuse_large_blocks() is True
    # and the processes this one starts (the -n workers) read them from the environment
    assert all(os.environ[name] == value for name, value in MALLOC_ENV.items())
    minor_faults_of_three_blocks()  # the heap grows once
    # reused: not the 3 × 16384 faults of three fresh mappings (glibc's default)
    assert minor_faults_of_three_blocks() < pages // 4
    release_freed_memory()  # handed back to the OS, as after each layer
