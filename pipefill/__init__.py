"""PipeFill core: torch-free pieces shared by the operator, the trainer and the fill executor.

Subpackages: ``spec`` (the two custom resources as typed models, their schema and validation),
``channel`` (the per-pod bubble channel), ``schedules`` (pipeline schedules and the timeline simulator),
``metrics`` (metric names), ``cli`` (the ``pipefill`` command).
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
