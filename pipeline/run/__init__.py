"""The run layer: settings (`settings.py`), the round driver and its stages (`rounds.py`), the
experiment record and report (`report.py`), trackers (`tracking.py`), the evaluation cache."""
