"""A verifiers 0.4 environment (scaffolded by `vf-init sum-v1`): one addition question, scored by
its last number. `examples/verifiers_program.py` plays it through maxit's endpoint."""

import re

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int = 0


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def reward(self, trace: vf.Trace) -> float:
        content = trace.last_message.content if trace.nodes else ""
        found = re.findall(r"-?\d+", content if isinstance(content, str) else str(content))
        return float(bool(found) and int(found[-1]) == self.data.answer)


class SumConfig(vf.TasksetConfig):
    question: str = "12+34="
    answer: int = 46


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        return [SumTask(SumData(prompt=self.config.question, answer=self.config.answer), self.config.task)]
