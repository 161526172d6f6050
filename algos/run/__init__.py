"""A training run around an algorithm's collect and update: what a trainer starts from (RunSetup, setup.py), its
config resolved once before anything loads (resolve.py), building it and the loop (loop.py), the supervised warm start
(warm_start.py), held-out evaluation (evaluation.py), checkpoints (checkpoint.py) in the run directory (directory.py),
metrics (reporting.py) and health alarms (alarms.py)."""
