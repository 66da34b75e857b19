"""`--workflow plan_path`: AT-GRPO's Plan-Path shape on the grid's mazes, a tool agent whose call
the environment executes and a plan agent that reads the call and its output and commits the
moves, over several turns (`workflow.py`); the game, the executor and the rewards (`game.py`);
its embedded model, warm-started in code (`model.py`).

The mechanism. Each turn the tool agent writes a path (letters U, D, L, R) and the environment
RUNS it from the team's position as a trial, without moving the team: the output says whether
and by which move it reached the goal (`goal N`), which move ran into a wall or off the grid
(`wall N`), that it ended elsewhere (`end N`), or that the text was not a path (`bad`). The plan
agent sees the maze, the call and that output, and writes the path the team commits: it is run
for real, and the team stands where it stopped (at the goal, before the first blocked move, or
at its end). The next turn starts from there; the episode ends at the goal or after `turns`.

What each role holds. The tool agent sees only the maze; its trial is free (it does not move the
team). The plan agent sees the maze and the environment's verdict on a candidate path: whether
it reaches the goal and where it breaks. The model cannot run a path in its head reliably (a 1M
model writing a six-letter path tracks its position implicitly), so a verified call is
information it cannot produce alone: a plan agent that keeps a call whose trial reached the goal
commits a path known to be right. A single agent doing the job (`single_agent()`, `team=single`)
takes the plan agent's seat without the tool: it sees the maze alone, the tool's prompt, and its path is committed directly, one call a turn: it
never learns whether a path works before the team is moved, only where the team stands after
the commit.

Rewards: tool, 1.0 when its trial reaches the goal; plan (and the single agent), 1.0 when its
committed path reaches the goal; team, 1.0 when the team stands on the goal.
"""

from pipeline.workflows.plan_path.game import MAX_PATH, PLAN, TOOL, PlanPathEnv, Trial, plan_text, read_path, run_path, tool_text
from pipeline.workflows.plan_path.workflow import TEAMS, PlanPathWorkflow

__all__ = ["PlanPathWorkflow", "PlanPathEnv", "Trial", "TEAMS", "run_path", "read_path", "tool_text", "plan_text", "TOOL", "PLAN", "MAX_PATH"]
