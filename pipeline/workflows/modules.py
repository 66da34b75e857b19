"""Importing a workflow's module given as a file path ("examples/relay.py") or a module path, and
resolving "MODULE:ATTR" in it, for
`pipeline.workflows.load_workflow` and the program workflow (`pipeline.workflows.program`)."""

from __future__ import annotations

__all__ = ["import_file", "resolve"]


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


def resolve(spec: str, name: str):
    """(module, object) of `spec` = "FILE.py:ATTR" or "pkg.module:ATTR" (ATTR may be dotted); a
    one-line ConfigError naming the workflow `name` when it cannot be imported or found."""
    import importlib

    from pipeline.errors import ConfigError

    module_name, _, attr = spec.rpartition(":")
    try:
        module = import_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"workflow {name!r}: cannot import module {module_name!r} ({err})") from None
    except Exception as err:  # noqa: BLE001 - a user's module may fail to import in any way
        raise ConfigError(f"workflow {name!r}: importing {module_name!r} raised {type(err).__name__}: {err}") from None
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"workflow {name!r}: module {module_name!r} has no {attr!r}")
    return module, obj
