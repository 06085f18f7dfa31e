"""Drafter plug-ins: drafters declared outside this package and named by the `drafter_plugins` setting.

The convention: a plug-in is an importable module (on the serving Python's path: installed in its environment or
on PYTHONPATH) whose attribute DRAFTERS is a non-empty sequence of registry.DrafterSpec. Loading imports each named
module and registers each spec (registry.register: the same spec again does nothing, so a module may be named by
several configs and loads of one process). Each spec's `make` ("module:function", called with the EngineConfig)
builds its drafter, a speculation.drafter.Drafter; a plug-in's drafters are built by `make`, never by the model
loader. Loading happens when the config is read (config.py), so that the `drafter` setting may name a plug-in's
drafter and the statistics' labels and the contract's text include it.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module

from ..errors import ModelLoadError
from . import registry


def parse(setting: str) -> tuple[str, ...]:
    """The `drafter_plugins` setting's module paths: comma-separated, spaces around each ignored."""
    return tuple(m.strip() for m in setting.split(",") if m.strip())


def load(modules: Sequence[str]) -> list[str]:
    """Import each module and register the drafters it declares -> their names, in order. ModelLoadError naming
    the module where one cannot be imported, declares no drafters, or declares one that does not hold."""
    out: list[str] = []
    for path in modules:
        specs = declared(path)
        for spec in specs:
            if spec.make is None:
                raise ModelLoadError(
                    f'drafter_plugins: {path}: drafter {spec.name!r} needs `make` ("module:function" building it)'
                )
            try:
                registry.register(spec)
            except ValueError as e:
                raise ModelLoadError(f"drafter_plugins: {path}: {e}") from None
            out.append(spec.name)
    return out


def declared(path: str) -> list[registry.DrafterSpec]:
    """The specs a plug-in module declares (its DRAFTERS); ModelLoadError where it cannot be imported or declares
    none."""
    try:
        module = import_module(path)
    except Exception as e:  # a missing module, or one whose own code fails: the load's error says which
        raise ModelLoadError(f"drafter_plugins: could not import {path!r}: {type(e).__name__}: {e}") from e
    specs = getattr(module, "DRAFTERS", None)
    if not isinstance(specs, Sequence) or not specs or not all(isinstance(s, registry.DrafterSpec) for s in specs):
        raise ModelLoadError(
            f"drafter_plugins: module {path!r} declares no drafters: it must define DRAFTERS, a non-empty list of "
            "specgram.drafting.registry.DrafterSpec"
        )
    return list(specs)
