"""What :func:`kiln.patch` did: the modules it replaced and the candidates it left, why."""

from dataclasses import dataclass, field
from typing import List


@dataclass(frozen=True)
class Replaced:
    path: str  # the module's name in ``model.named_modules()`` ("" is the model itself)
    kind: str  # what the module computes, e.g. "rms_norm (llama rounding)" or "mlp swiglu"
    op: str  # the kiln op that now computes it


@dataclass(frozen=True)
class Left:
    path: str
    cls: str
    reason: str


@dataclass
class PatchReport:
    replaced: List[Replaced] = field(default_factory=list)
    left: List[Left] = field(default_factory=list)

    def __str__(self) -> str:
        rows = [("replaced", r.path or "<model>", r.kind, r.op) for r in self.replaced]
        rows += [("left", l.path or "<model>", l.cls, l.reason) for l in self.left]
        header = ("", "module", "kind / class", "kiln op / reason")
        widths = [max(len(row[i]) for row in rows + [header]) for i in range(3)]
        lines = [f"kiln.patch: {len(self.replaced)} replaced, {len(self.left)} left"]
        for row in [header] + rows:
            lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
        return "\n".join(line.rstrip() for line in lines)
