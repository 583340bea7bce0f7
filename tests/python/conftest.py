import gc
import os
import tempfile

import pytest
import torch

# Every test process gets its own cache, so tests never see a developer's cache. A
# pytest-xdist worker inherits the cache its controller made; it takes one of its own, so
# that what a test finds cached never depends on which tests another worker ran.
if "KILN_CACHE_DIR" not in os.environ:
    os.environ["KILN_CACHE_DIR"] = os.environ["KILN_TEST_OWN_CACHE"] = tempfile.mkdtemp(
        prefix="kiln-test-cache-")
elif "PYTEST_XDIST_WORKER" in os.environ and \
        os.environ["KILN_CACHE_DIR"] == os.environ.get("KILN_TEST_OWN_CACHE"):
    os.environ["KILN_CACHE_DIR"] = os.environ["KILN_TEST_OWN_CACHE"] = tempfile.mkdtemp(
        prefix=f"kiln-test-cache-{os.environ['PYTEST_XDIST_WORKER']}-")

import kiln  # noqa: E402

HAS_GPU = torch.cuda.is_available() and kiln.device_count() > 0


@pytest.fixture(autouse=True)
def return_cached_gpu_memory(request):
    """A GPU test's freed tensors stay in its process's caching allocator, out of the other
    pytest-xdist workers' reach: eight workers that each kept their last large test's memory
    (10-30 GiB apiece) ran a ninth allocation out of the GPU's. What a test leaves past 2 GiB
    goes back to the driver when it ends."""
    yield
    if HAS_GPU and "gpu" in request.keywords and torch.cuda.is_initialized() \
            and torch.cuda.memory_reserved() > (2 << 30):
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def heuristic_tuning():
    """kiln's heuristic configs for a module's GPU tests: they check every specialisation's
    kernel, and tuning them all would take minutes (tuning is tested on its own). The
    settings a module may change are restored after it."""
    before = kiln.settings()
    kiln.configure(tune="off")
    yield
    kiln.configure(tune=before["tune_mode"], capture=before["capture"], pdl=before["pdl"])


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped where there is none)")
