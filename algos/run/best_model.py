"""The best model a run held (run.metric_for_best_model): output_dir/best_model, the policy at the held-out evaluation
that scored highest, as transformers' Trainer keeps its best checkpoint (metric_for_best_model,
load_best_model_at_end), but as a directory beside the last model, so a run that drifts after its peak loses nothing.

best_model/ is what a checkpoint's model/ is (a transformers directory, or a LoRA adapter in PEFT's format) plus
best.json: {"metric", "value", "step"}. It is written under a temporary name and renamed into place. A resumed run
reads best.json and keeps the model unless a later evaluation beats it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from algos.run.checkpoint import export_model, replace_directory
from algos.run.directory import BEST_MODEL_DIR
from algos.run.setup import RunSetup
from algos.system.distributed import barrier

BEST_FILE = "best.json"


def read_best(output_dir: Path, metric: str) -> dict[str, Any] | None:
    """best_model/best.json of ``output_dir`` when it holds a model chosen by ``metric``, else None."""
    path = Path(output_dir) / BEST_MODEL_DIR / BEST_FILE
    if not path.is_file():
        return None
    best = json.loads(path.read_text())
    return best if best.get("metric") == metric else None


class BestModel:
    """Offered each held-out evaluation's scores; saves the policy when run.metric_for_best_model's is the highest
    yet (ties keep the earlier model). Every rank calls ``offer`` (the export gathers FSDP2's shards)."""

    def __init__(self, run: RunSetup, resumed: bool):
        self.run = run
        self.metric = run.config.run.metric_for_best_model
        # A fresh run's first evaluation replaces whatever an earlier run left; a resumed one competes with its own.
        self.best = read_best(run.output_dir, self.metric) if resumed and self.metric else None

    def offer(self, step: int, scores: dict[str, float]) -> dict[str, Any] | None:
        """Save the policy as the best model when scores[metric] beats the best so far -> best.json's record, or
        None when nothing was saved (off, or not better)."""
        if self.metric is None or (self.best is not None and scores[self.metric] <= self.best["value"]):
            return None
        self.best = {"metric": self.metric, "value": scores[self.metric], "step": step}
        final = self.run.output_dir / BEST_MODEL_DIR
        tmp, stale = final.with_name(f".{BEST_MODEL_DIR}.tmp"), final.with_name(f".{BEST_MODEL_DIR}.stale")
        if self.run.world.is_main:  # a killed run's half-written ones
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(stale, ignore_errors=True)
        export_model(self.run.modules, self.run.model, tmp, self.run.tokenizer)
        if self.run.world.is_main:
            (tmp / BEST_FILE).write_text(json.dumps(self.best) + "\n")
            replace_directory(tmp, final, stale=stale)
        barrier()
        return self.best
