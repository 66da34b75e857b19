from sum_v1.taskset import SumTaskset

__all__ = ["SumTaskset"]
