"""What the Ascend preflight hands back: one result per check, the report over them, and how it prints.

Kept apart from the checks so that the callers that only read a report (the
doctor's output, the launcher hook's logging) need nothing but these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: str  # "pass" | "warn" | "fail"
    message: str
    fix: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "status": self.status, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class AutoSizing:
    """What the launch exports when no HCCL buffer is set, and why."""

    variable: str
    mb: int
    required_mb: int
    margin_mb: int
    derivation: str


@dataclass(frozen=True)
class PreflightReport:
    checks: tuple[CheckResult, ...]
    auto_sizing: Optional[AutoSizing] = None
    summary: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.status == FAIL)

    def by_id(self, check_id: str) -> CheckResult:
        for check in self.checks:
            if check.id == check_id:
                return check
        raise KeyError(check_id)

    def to_json_dict(self) -> dict:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks]}

    def render(self) -> str:
        counts = {s: sum(c.status == s for c in self.checks) for s in (FAIL, WARN, PASS)}
        head = (
            f"sglang-edgeacc doctor: {counts[FAIL]} failing, {counts[WARN]} warning, {counts[PASS]} passing"
            + (f" ({self.summary})" if self.summary else "")
        )
        lines = [head]
        # Failures first, then warnings: the lines that need action are the ones read.
        for c in sorted(self.checks, key=lambda c: {FAIL: 0, WARN: 1, PASS: 2}[c.status]):
            lines.append(f"  {c.status.upper():4} {c.id}: {c.message}")
            if c.fix and c.status != PASS:
                lines.append(f"       fix: {c.fix}")
        if self.auto_sizing is not None:
            a = self.auto_sizing
            lines.append(f"  auto-sizing: export {a.variable}={a.mb}  ({a.derivation})")
        return "\n".join(lines)
