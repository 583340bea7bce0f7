"""The GPU tests that hold tens of GiB run one at a time across pytest-xdist workers.

The workers share one GPU. Two of these tests at once (a 32768 x 14848 norm with its fp64
references holds some 35 GiB, the 32-bit index test about 26 GiB), beside the other workers'
tests, have run a worker out of GPU memory. Each takes an exclusive lock on a file all workers
see, and gives its memory back to the driver before it lets go, so the next one finds it free.
"""

import contextlib
import fcntl
import gc
import os
import tempfile

import torch

LOCK_PATH = os.path.join(tempfile.gettempdir(), "kiln-tests-gpu-memory.lock")


@contextlib.contextmanager
def gpu_memory_to_itself():
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)
