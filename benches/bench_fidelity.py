"""asv suite: how far trn2core's predictions are from every published Trainium2 measurement
(benches/fidelity/published.toml; see docs/fidelity.md). The factors change only when the model
or the table does: ``max(predicted / published, published / predicted)``, median and worst."""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "fidelity", Path(__file__).resolve().parent / "fidelity_table.py"
)
fidelity = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("fidelity", fidelity)
_spec.loader.exec_module(fidelity)


class Fidelity:
    """Published Trn2 measurements against the model."""

    def setup(self):
        self.rows = fidelity.evaluate()

    def track_median_factor_high(self):
        return fidelity.summary(self.rows, ("high",))["median"]

    track_median_factor_high.unit = "x"

    def track_worst_factor_high(self):
        return fidelity.summary(self.rows, ("high",))["worst"]

    track_worst_factor_high.unit = "x"

    def track_median_factor_high_medium(self):
        return fidelity.summary(self.rows, ("high", "medium"))["median"]

    track_median_factor_high_medium.unit = "x"

    def track_worst_factor_high_medium(self):
        return fidelity.summary(self.rows, ("high", "medium"))["worst"]

    track_worst_factor_high_medium.unit = "x"

    def time_predict_every_point(self):
        fidelity.evaluate()
