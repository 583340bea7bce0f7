"""What a diffusion transformer's attention processors derive from the tensors every block of
one forward receives (rotation tables): derived once a forward, not once a block."""

import weakref
from typing import Callable

import torch

from .forwards import recording_a_graph


class OncePerForward:
    """``make(*sources)`` for the last sources seen. The sources are referred to weakly, so that
    the entry goes with them (nothing derived outlives its forward, and a new tensor at a dead
    one's address is no match), and an entry is one tuple, replaced whole, so that a thread
    never reads another thread's result with its own sources."""

    def __init__(self, make: Callable):
        self.make = make
        self.entry = None  # (weak sources, their versions, what was made)

    def get(self, *sources: torch.Tensor, extra: tuple = ()):
        """``make(*sources, *extra)``; ``extra``: hashable values (sizes) what is made depends on
        beside the sources."""
        # Inference tensors keep no version counter: an in-place change would go unseen.
        if recording_a_graph(sources[0]) or any(s.is_inference() for s in sources):
            return self.make(*sources, *extra)
        versions = tuple(s._version for s in sources) + tuple(extra)
        entry = self.entry
        if entry is not None and entry[1] == versions and all(w() is s for w, s in zip(entry[0], sources)):
            return entry[2]
        made = self.make(*sources, *extra)
        entry = None

        def forget(_):
            if self.entry is entry:
                self.entry = None

        entry = (tuple(weakref.ref(s, forget) for s in sources), versions, made)
        self.entry = entry
        return made
