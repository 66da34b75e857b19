import pytest

from fakes import FakeTask
from pipeline.workflows.math.orchestra import ENVIRONMENT, FEEDBACK_TURNS, MathOrchestra, Utterance, default_agents, solver_view, verifier_view
from pipeline.rollout.agent import Agent
from pipeline.errors import ConfigError
from pipeline.strategies import IID, Feedback, PromptAug, Tree


def test_agent_validation_names_the_field():
    assert Agent("critic").role == "critic"  # any role label; its workflow reads it
    with pytest.raises(ConfigError, match="Agent.role"):
        Agent("a", "")
    with pytest.raises(ConfigError, match="Agent.agent_id"):
        Agent("", "solver")
    with pytest.raises(ConfigError, match="Agent.policy_id"):
        Agent("a", "solver", policy_id="")


def test_default_agents_share_or_split_policies():
    solver, verifier = default_agents()
    assert (solver.agent_id, solver.role, solver.policy_id) == ("solver", "solver", "shared")
    assert (verifier.agent_id, verifier.role, verifier.policy_id) == ("verifier", "verifier", "shared")
    solver, verifier = default_agents(shared_policy=False)
    assert (solver.policy_id, verifier.policy_id) == ("solver", "verifier")


def test_solver_view_own_attempts_are_assistant_turns():
    opening = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    view = solver_view(opening, ["A1", "A2"], [Utterance("verifier", "R1"), Utterance(ENVIRONMENT, "F2")])
    assert view == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "R1"},
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "F2"},
    ]
    assert opening == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    with pytest.raises(ValueError, match="one reply per attempt"):
        solver_view(opening, ["A1"], [])


def test_verifier_sees_the_solver_answer_inside_a_user_message():
    task = FakeTask()
    problem = task.problems("train", 1, 0)[0]
    view = verifier_view(task, problem, "The answer is 3.")
    assert all(m["role"] != "assistant" for m in view)
    assert "The answer is 3." in view[-1]["content"] and view[-1]["role"] == "user"


def test_schedule_alternates_roles_and_covers_feedback():
    orch = MathOrchestra(FakeTask())
    steps = orch.schedule(3, [IID()])
    assert [(s.step, s.turn, s.role) for s in steps] == [
        (0, 0, "solver"), (1, 0, "verifier"), (2, 1, "solver"), (3, 1, "verifier"), (4, 2, "solver"), (5, 2, "verifier"),
    ]
    assert len(orch.schedule(1, [IID()])) == 2
    assert len(orch.schedule(1, [IID(), Feedback()])) == 2 * FEEDBACK_TURNS


def test_continues_stops_approved_samples_and_runs_feedback_twice():
    orch = MathOrchestra(FakeTask())
    for s in (IID(), PromptAug(), Tree()):
        assert orch.continues(s, 0, approved=False, max_loop_num=2)
        assert not orch.continues(s, 0, approved=True, max_loop_num=2)
        assert not orch.continues(s, 1, approved=False, max_loop_num=2)
    fb = Feedback()
    assert orch.continues(fb, 0, approved=True, max_loop_num=1)
    assert not orch.continues(fb, 1, approved=False, max_loop_num=5)


def test_reply_is_task_feedback_for_feedback_and_rejection_otherwise():
    task = FakeTask()
    problem = task.problems("train", 1, 0)[0]
    orch = MathOrchestra(task)
    fb = orch.reply(Feedback(), problem, "The answer is -1000.", "no")
    assert fb == Utterance(ENVIRONMENT, task.feedback_message(problem, "The answer is -1000.")["content"])
    rej = orch.reply(IID(), problem, "The answer is -1000.", "  no, 3+4 is 7 ")
    assert rej.speaker == "verifier" and "no, 3+4 is 7" in rej.text


def test_orchestra_validates_its_task_and_template():
    with pytest.raises(ConfigError, match="Task protocol"):
        MathOrchestra(object())
    with pytest.raises(ConfigError, match="rejection_template"):
        MathOrchestra(FakeTask(), rejection_template="rejected")


def test_opening_applies_the_strategy_augmentation():
    task = FakeTask()
    problem = task.problems("train", 1, 0)[0]
    orch = MathOrchestra(task)
    assert orch.opening(IID(), problem) == task.solver_messages(problem)
    aug = orch.opening(PromptAug(), problem)
    assert any(m["role"] == "system" and m["content"] == "Hint: " + problem.hint for m in aug)
