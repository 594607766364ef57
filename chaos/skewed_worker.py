"""The worker of a skewed restart (chaos/skewed_restart.py says what and why): a model
worker that loads the changed checkpoint (seed + 1) once the flag file exists as it starts,
and then logs every token it samples.  Its own module: it imports torch, which chaos's
command line does not need."""

from __future__ import annotations

import dataclasses
import json
import os

from chaos.skewed_restart import FLAG_KEY
from executor.model.batch import ModelBatch, ModelOutput
from executor.model.transformer import StageModel
from executor.model.worker import ModelWorker


class SkewedRestartWorker(ModelWorker):
    """Loads seed + 1's weights once FLAG exists; appends (request, position, token) of
    every token it samples (the output rank) to FLAG.jsonl."""

    skew_log: str | None = None

    def _load_model(self) -> StageModel:
        flag = str(self.ctx.worker_kwargs[FLAG_KEY])
        if os.path.exists(flag):
            self.skew_log = flag + ".jsonl"
            self.cfg = dataclasses.replace(self.cfg, seed=self.cfg.seed + 1)
        return super()._load_model()

    def execute_model(self, batch: ModelBatch) -> ModelOutput | None:
        output = super().execute_model(batch)
        if output is not None and self.skew_log is not None:
            lines = [json.dumps([rid, pos, tok]) + "\n" for rid, pos, tok in
                     zip(batch.request_ids, batch.positions, output.sampled_token_ids, strict=True)]
            with open(self.skew_log, "a") as log:
                log.write("".join(lines))
        return output
