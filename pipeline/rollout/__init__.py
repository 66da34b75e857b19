"""Rollouts: the workflow contract a team implements (`contract.py`, `workflow.py`, `agent.py`), the
loop that runs its episodes under the search strategies into `steps` rows (`loop.py`; its rollout
config, request seeds and shards in `sampling.py`, its rows and table in `rows.py`), rewards
(`rewards.py`), the held-out evaluation that reuses the loop (`evaluation.py`) and synthetic
steps tables for tests and benchmarks (`synthetic.py`)."""
