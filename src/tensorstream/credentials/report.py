"""The credential report: each value, masked when secret, with the source that supplied it."""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import Sourced, mask

__all__ = ["CredentialReport", "ReportLine", "report_line", "tls_notes"]


@dataclasses.dataclass(frozen=True)
class ReportLine:
    """One value: its name, how it is shown (masked if secret) and its source."""

    name: str
    shown: str
    source: str


@dataclasses.dataclass(frozen=True)
class CredentialReport:
    """What :func:`describe_credentials` returns; ``str()`` is a readable table.

    Holds no secret: every secret value is already masked in ``lines``.
    """

    uri: str
    lines: tuple[ReportLine, ...]
    looked_in: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def source_of(self, name: str) -> str | None:
        """The source of value ``name``, or ``None`` if it is unset."""
        for line in self.lines:
            if line.name == name:
                return None if line.source == "-" else line.source
        return None

    def as_dict(self) -> dict[str, dict[str, str]]:
        return {line.name: {"value": line.shown, "source": line.source} for line in self.lines}

    def __str__(self) -> str:
        width = max((len(line.name) for line in self.lines), default=0)
        shown = max((len(line.shown) for line in self.lines), default=0)
        out = [f"credentials for {self.uri}"]
        out += [f"  {ln.name:<{width}}  {ln.shown:<{shown}}  {ln.source}" for ln in self.lines]
        if self.looked_in:
            out.append("  looked in: " + ", ".join(self.looked_in))
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"<CredentialReport {self.uri}: {len(self.lines)} values>"


def report_line(name: str, value: Sourced[Any] | None, *, shown: str | None = None) -> ReportLine:
    """One report line for ``value`` (``<unset>`` when absent), masked when secret."""
    if value is None:
        return ReportLine(name, "<unset>", "-")
    if shown is None:
        shown = mask(str(value.value)) if value.secret else str(value.value)
    return ReportLine(name, shown, value.source)


def tls_notes(options: dict[str, Any]) -> tuple[str, ...]:
    """Notes on how TLS is verified under ``options``."""
    if options.get("insecure"):
        return ("insecure=True: TLS certificates are not verified",)
    if options.get("ca_bundle"):
        return (f"TLS verified against ca_bundle {options['ca_bundle']}",)
    return ()
