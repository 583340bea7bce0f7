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


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped where there is none)")
