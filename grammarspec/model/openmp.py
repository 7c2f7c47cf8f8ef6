"""One OpenMP thread pool per process, so that a worker thread runs torch's CPU kernels at full speed.

torch's CPU kernels run on OpenMP, and every thread that enters a parallel
region gets a pool of worker threads of its own.  Once a process holds more
OpenMP threads than it has CPUs, GNU OpenMP (the runtime of torch's wheels)
stops letting idle workers spin: each parallel region then wakes its workers
from sleep, which on a small VM costs about 0.1 ms, hundreds of times per
forward.  The server loads its model on the main thread and decodes on its
engine thread; with the main thread's pool alive beside the engine's, every
forward in the engine thread is slower than the same forward on the main
thread (BENCHMARKS.md measures it).  :func:`release_thread_pool`, called on a thread whose torch
work is done, frees that thread's pool (OpenMP 5's ``omp_pause_resource_all``),
and the pool of the thread that decodes is then the only one.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["release_thread_pool"]

_OMP_PAUSE_HARD = 2  # omp_pause_resource_t: free the threads too


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP workers; whether the runtime did.

    Harmless where there is nothing to free (the next parallel region on this
    thread starts a pool again) and a no-op (False) where the process has no
    OpenMP runtime with ``omp_pause_resource_all`` (or on Windows).
    """
    if sys.platform == "win32":
        return False
    try:
        pause = ctypes.CDLL(None).omp_pause_resource_all  # whichever OpenMP runtime torch loaded
    except (AttributeError, OSError):
        return False
    pause.restype, pause.argtypes = ctypes.c_int, [ctypes.c_int]
    return bool(pause(_OMP_PAUSE_HARD) == 0)
