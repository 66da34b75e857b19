"""What a store's rounds are read back as, above the run layer that writes them: the round table and
the console's lines (`report.py`), the report as markdown with the team's baselines and arms
(`markdown.py`) and as HTML (`html_report.py`), the held-out metrics that regressed
(`regression.py`), the verdict against the arms (`verdict.py`), the rounds logged to experiment
trackers (`round_scalars.py`, `tracking.py`) and the list of experiments (`experiments.py`)."""
