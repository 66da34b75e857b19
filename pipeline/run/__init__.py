"""The run layer: settings (`settings.py`), the round context (`context.py`), the round's stages
(`rounds.py`) and their seconds (`timings.py`), the experiment record (`experiments.py`), the
round table (`report.py`) and the HTML report (`html_report.py`), trackers (`tracking.py`), the
evaluation cache (`eval_cache.py`)."""

LINE_WIDTH = 120
"""The widest line maxit writes to the console (`maxit run`'s round lines and tables)."""
