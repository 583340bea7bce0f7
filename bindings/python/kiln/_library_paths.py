"""Where NVRTC can be found besides the system: the NVIDIA libraries that ship inside a
pip-installed torch (site-packages/nvidia/<pkg>/lib). Handed to the native loader, which
tries them after KILN_NVRTC and the system's own libraries."""

import importlib.util
import os


def nvidia_library_dirs():
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for root in spec.submodule_search_locations:
        try:
            packages = sorted(os.listdir(root))
        except OSError:
            continue
        for package in packages:
            lib = os.path.join(root, package, "lib")
            if os.path.isdir(lib):
                dirs.append(lib)
    return dirs


def register(native):
    for path in nvidia_library_dirs():
        native.add_library_search_dir(path)
