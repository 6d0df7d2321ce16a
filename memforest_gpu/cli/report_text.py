"""Human-readable summaries of a compression run."""
from __future__ import annotations

from ..engine.compression import STAGES
from ..printable import printable
from ..report import CompressReport

__all__ = ["format_report", "size_line", "kb"]


def kb(n: int) -> str:
    """Bytes as a short figure (KB, MB or GB, 1,000-based)."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:,.1f} {unit}"
    return f"{n} B"


def size_line(inp: dict, out: dict) -> str:
    """The output's size against its input in the same encoding (store/size.py)."""
    rows = out["rows"] / inp["originals"] if inp["originals"] else 0.0
    share = out["bytes"] / inp["bytes"] if inp["bytes"] else 0.0
    return (f"size: {inp['rows']:,} -> {out['rows']:,} vector rows searched ({rows:.2f} per memory); texts + "
            f"vectors {kb(inp['bytes'])} -> {kb(out['bytes'])}, {share:.0%} of the uncompressed store in the same "
            f"encoding ({out['encoding']})")


def format_report(r: CompressReport, *, max_tenants: int = 20, keep_pattern: str | None = None) -> str:
    """A short table: nodes in/out per tenant (names with their control characters escaped),
    ratio reached, trees, rounds, time per stage; ``keep_pattern``: the ``--keep-pattern`` given,
    noted when it matched no node."""
    lines = [f"{'tenant':<24} {'in':>8} {'out':>8} {'removed':>8} {'ratio':>6} {'trees':>6}  note"]
    for t in r.tenants[:max_tenants]:
        note = "; ".join(([f"{t.kept} kept (keep rule)"] if t.kept else [])
                         + ([f"short by {t.shortfall} (tenant too small, groups too small or merges too long)"]
                            if t.shortfall else []))
        lines.append(f"{printable(t.tenant)[:24]:<24} {t.nodes_in:>8} {t.nodes_out:>8} {t.removed:>8} "
                     f"{t.ratio:>6.3f} {t.trees:>6}  {note}")
    if len(r.tenants) > max_tenants:
        rest = r.tenants[max_tenants:]
        lines.append(f"... and {len(rest)} more tenants ({sum(t.nodes_in for t in rest)} nodes in, "
                     f"{sum(t.nodes_out for t in rest)} out)")
    lines.append(f"{'total':<24} {r.nodes_in:>8} {r.nodes_out:>8} {r.nodes_in - r.nodes_out:>8} "
                 f"{r.ratio_reached:>6.3f} {r.trees:>6}")
    if getattr(r, "kept", 0):
        lines.append(f"kept: {r.kept} nodes match the keep rule and are never merged (the ratio applies to the others)")
    if keep_pattern is not None and not getattr(r, "kept", 0):
        lines.append(f"kept: --keep-pattern {keep_pattern!r} matches no node, so it kept none (every node could "
                     "merge): check the pattern (RE2, case-sensitive unless it starts with (?i))")
    if r.shortfall:
        lines.append(f"shortfall: {r.shortfall} removals could not be made (reported per tenant above)")
    lines.append(f"schedule {r.schedule}: {r.merges} merges in {r.rounds} rounds; merger {r.merger}; "
                 f"embedder {r.embedder}; "
                 + (f"node cap {r.max_node_tokens} tokens" if r.max_node_tokens else "no node cap")
                 + (f"; {r.fallbacks} merger texts replaced by the extractive merger's (over the node cap or "
                    "unusable)" if r.fallbacks else "")
                 + (f"; {r.condensed} merges condensed to the cap ({r.condensed_tokens} tokens dropped, "
                    f"{r.condensed_tokens / r.condensed:.0f} per condensed merge)" if getattr(r, "condensed",
                                                                                              0) else ""))
    if r.size_in and r.size_out:
        lines.append(size_line(r.size_in, r.size_out))
    s = r.seconds
    stages = ", ".join(f"{k} {s[k]:.2f}s" for k in STAGES
                       if k in s)
    lines.append(f"time: {s.get('total', 0):.2f}s ({stages})")
    return "\n".join(lines)
