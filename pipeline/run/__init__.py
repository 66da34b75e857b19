"""The run layer: settings (`settings.py`), the round context (`context.py`), the round's stages
(`rounds.py`) and their seconds (`timings.py`), the experiment record (`experiment_record.py`),
the evaluation cache (`eval_cache.py`). What the rounds are read back as is `pipeline.reporting`."""

LINE_WIDTH = 120
"""The widest line maxit writes to the console (`maxit run`'s round lines and tables)."""
