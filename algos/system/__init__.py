"""Where and how a run computes: device and precision (runtime.py, hardware.py), AdamW and the guarded step
(runtime.py), data parallelism (distributed.py), memory budgets (memory.py) and a run's checkpoint paths (paths.py).
Nothing here knows a model's head, a task or an algorithm."""
