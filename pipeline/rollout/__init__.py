"""Rollouts: the workflow contract a team implements (`contract.py`, `workflow.py`, `agent.py`), the
loop that runs its episodes under the search strategies into `steps` rows (`loop.py`), rewards
(`rewards.py`) and the held-out evaluation that reuses the loop (`evaluation.py`)."""
