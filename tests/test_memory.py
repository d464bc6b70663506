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


def test_freed_memory_is_trimmed_only_after_the_resident_size_grew_by_the_limit(monkeypatch):
    from fixtures.engine import memory

    trims = []
    sizes = iter([])
    monkeypatch.setattr(memory, "_MALLOC_TRIM", lambda pad: trims.append(pad) or 1)
    monkeypatch.setattr(memory, "_SIZE_AFTER_TRIM", None)
    monkeypatch.setattr(memory, "resident_bytes", lambda: next(sizes))
    limit = memory.FREED_HELD_LIMIT

    def release(*readings: int | None) -> int:
        """release_freed_memory with the resident sizes it reads; how many trims it made."""
        nonlocal sizes
        sizes = iter(readings)
        before = len(trims)
        memory.release_freed_memory()
        assert next(sizes, "all read") == "all read"  # it read exactly these sizes
        return len(trims) - before

    assert release(900, 500) == 1  # the first layer: a trim, and the size after it noted
    assert release(500 + limit - 1) == 0  # grown by less than the limit: memory kept for reuse
    assert memory._SIZE_AFTER_TRIM == 500
    assert release(500 + limit, 700) == 1  # grown by the limit: trimmed, the new size noted
    assert memory._SIZE_AFTER_TRIM == 700
    assert release(None, None) == 1  # the size cannot be read: a trim every layer, as before
    assert trims == [0, 0, 0]  # malloc_trim(0): every free page handed back


def test_resident_bytes_reads_this_process_size():
    from fixtures.engine.memory import resident_bytes

    size = resident_bytes()
    if platform.system() != "Linux":
        assert size is None or size > 0
        return
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    assert 10 << 20 < size <= peak * 1.01 + (1 << 20)  # a Python with torch: over 10 MiB
