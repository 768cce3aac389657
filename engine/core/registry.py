"""Name tables by discovery: every class of a family found in its package's files, by its `name`.

Used for each pluggable family (policies/registry.py, sim/router, sim/cost_model): adding a member
is one file in the family's package (plus one YAML under conf/), never an edit to a list.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil


def discover(package, base: type) -> dict[str, type]:
    """name -> class for every concrete `base` subclass defined in a module of `package`.

    Modules named `base` or starting with "_" are skipped; a class without its own `name`
    (the base's) or with a name already taken is an error naming the class.
    """
    table: dict[str, type] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for obj in vars(module).values():
            if not (inspect.isclass(obj) and issubclass(obj, base) and obj.__module__ == module.__name__
                    and not inspect.isabstract(obj) and not obj.__name__.startswith("_")):
                continue
            name = getattr(obj, "name", None)
            if not name or name == getattr(base, "name", None) or name in table:
                raise TypeError(f"{obj.__module__}.{obj.__qualname__}: name {name!r} is "
                                f"{'taken' if name in table else 'missing or the base class name'}; give it its own")
            table[name] = obj
    return table
