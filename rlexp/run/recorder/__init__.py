"""The recorder and its parts (``recorder.py`` composes them): schedule, metrics, divergence, faults,
evaluations, outputs."""

from rlexp.run.recorder.divergence import Locate, Located
from rlexp.run.recorder.outputs import Job
from rlexp.run.recorder.recorder import Recorder

__all__ = ["Job", "Locate", "Located", "Recorder"]
