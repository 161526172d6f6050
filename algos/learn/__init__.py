"""What every algorithm's update runs on: one accumulate-and-step engine (engine.py) and one rule for rows per
micro-batch (micro_batches.py)."""

from algos.learn.engine import Accumulated, accumulate_and_step
from algos.learn.micro_batches import MicroBatchSizer

__all__ = ["Accumulated", "MicroBatchSizer", "accumulate_and_step"]
