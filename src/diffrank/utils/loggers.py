"""Lightning's CSV logger with a header that survives several processes writing one file.

Under ``strategy=ddp_spawn`` fit and test run in different spawned processes, each with a fresh copy of
the writer that does not know the columns the other one wrote; Lightning's writer then rewrites the file
with only its own columns and fails ("dict contains fields not in fieldnames"). This writer first takes
the columns already in the file.
"""

from __future__ import annotations

import csv

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as _CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter as _ExperimentWriter


class _MergingExperimentWriter(_ExperimentWriter):
    def _record_new_keys(self) -> set[str]:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                header = next(csv.reader(f), [])
            missing = [k for k in header if k not in self.metrics_keys]
            self.metrics_keys.extend(missing)
        return super()._record_new_keys()


class CSVLogger(_CSVLogger):
    """:class:`lightning.pytorch.loggers.CSVLogger` whose ``metrics.csv`` keeps every column across processes.

    Same arguments as Lightning's ``CSVLogger`` (``save_dir``, ``name``, ``version``, ``prefix``, …).
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> _ExperimentWriter:
        """The writer (created on first use, rank zero only)."""
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _MergingExperimentWriter(log_dir=self.log_dir)
        return self._experiment
