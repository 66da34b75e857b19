"""Importing a workflow's module given as a file path ("examples/relay.py"), for
`pipeline.workflows.load_workflow` and the program workflow (`pipeline.workflows.program`)."""

from __future__ import annotations

__all__ = ["import_file"]


def import_file(path: str):
    """A workflow module given as a file path ("examples/relay.py")."""
    import importlib.util
    import sys
    from pathlib import Path

    file = Path(path).resolve()
    if not file.is_file():
        raise ImportError(f"no such file {path}")
    name = f"maxit_workflow_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module
