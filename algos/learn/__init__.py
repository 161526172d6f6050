"""The one accumulate-and-step engine every algorithm's update runs on (algos/learn/engine.py)."""

from algos.learn.engine import Accumulated, accumulate_and_step

__all__ = ["Accumulated", "accumulate_and_step"]
