"""What a patch is, and how it is checked against the installed sglang.

A patch names every upstream symbol it touches (a :class:`Target`), with the
parameter list it was written against. :func:`verify` resolves each target in
the installed sglang before anything is installed, so a release that moved or
changed a symbol stops the load with the patch's and the symbol's names instead
of running half-patched.

A patch marked ``only_in_launcher`` changes what the launcher process does (the
one sglang was started in, not a ``multiprocessing`` child of it): it is
verified and installed there only, so the other processes do not import what
it targets. ``sglang-edgeacc patches`` verifies it like every other.
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
from dataclasses import dataclass, field
from typing import Callable, Optional


class PatchMismatch(RuntimeError):
    """An upstream symbol a patch relies on is missing or has changed."""


@dataclass(frozen=True)
class Target:
    path: str
    # Parameter names of the callable as written against the pin; None checks existence only.
    params: Optional[tuple[str, ...]] = None
    # A module-level name that is not a callable (a constant the patch rebinds).
    is_attribute: bool = False


@dataclass(frozen=True)
class TargetStatus:
    target: Target
    ok: bool
    detail: str


@dataclass(frozen=True)
class Patch:
    name: str
    summary: str
    targets: tuple[Target, ...]
    install: Callable[[], None] = field(repr=False)
    # Installs only in processes where this returns True (e.g. only on our CPU platform).
    applies: Callable[[], bool] = field(default=lambda: True, repr=False)
    # Verified and installed only in the launcher process (see the module docstring).
    only_in_launcher: bool = False

    def belongs_here(self) -> bool:
        return not self.only_in_launcher or in_launcher_process()


def in_launcher_process() -> bool:
    """True in the process sglang was started in; False in the processes it spawned."""
    return multiprocessing.parent_process() is None


def hook_installer(*hooks: tuple[str, Callable, str]) -> Callable[[], None]:
    """An install function that registers each ``(upstream path, hook, HookType name)`` in that order.

    The order matters where hooks share a target: HookRegistry wraps them in registration order.
    """

    def install() -> None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for path, hook, hook_type in hooks:
            HookRegistry.register(path, hook, HookType[hook_type])

    return install


def resolve(path: str):
    """Import ``a.b.C.meth`` by importing the longest importable module prefix."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and not module_name.startswith(exc.name):
                raise
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def _param_names(obj) -> tuple[str, ...]:
    return tuple(inspect.signature(inspect.unwrap(obj)).parameters)


def check_target(target: Target) -> TargetStatus:
    try:
        obj = resolve(target.path)
    except (ImportError, AttributeError) as exc:
        return TargetStatus(target, False, f"missing ({type(exc).__name__}: {exc})")
    if target.params is None:
        return TargetStatus(target, True, "present")
    try:
        found = _param_names(obj)
    except (TypeError, ValueError) as exc:
        return TargetStatus(target, False, f"not inspectable: {exc}")
    if found != target.params:
        return TargetStatus(target, False, f"signature changed: expected {target.params}, found {found}")
    return TargetStatus(target, True, "signature matches")


def verify(patch: Patch) -> None:
    for status in map(check_target, patch.targets):
        if not status.ok:
            raise PatchMismatch(
                f"sglang-edgeacc patch '{patch.name}' cannot apply: upstream symbol "
                f"'{status.target.path}' is {status.detail}. The installed sglang differs from the "
                f"pinned release; reinstall the pin or update the patch."
            )
