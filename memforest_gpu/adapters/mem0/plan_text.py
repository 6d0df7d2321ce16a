"""The plan of a Mem0 compression as text: which memories merge, with previews."""
from __future__ import annotations

from ...printable import printable

__all__ = ["format_plan"]


def format_plan(res, *, width: int = 72, max_groups: int | None = 50) -> str:
    """Which memories merge, with previews: one block per merged memory of ``res`` (a
    :class:`~.inplace.Mem0CompressResult`). Names, ids and texts from the store are shown
    with their control characters escaped (:func:`~memforest_gpu.printable.printable`)."""
    def short(t):
        t = printable(" ".join(str(t).split()))
        return t if len(t) <= width else t[: width - 3] + "..."

    n_merged_away = sum(len(g.members) for g in res.groups)
    lines = [f"scope {printable(res.scope.describe())}: {res.n_in} memories; {n_merged_away} merge into "
             f"{len(res.groups)} -> {res.n_in - n_merged_away + len(res.groups)} memories"]
    for why, n in sorted(res.left_alone.items()):
        lines.append(f"  left alone: {n} ({why})")
    shown = res.groups if max_groups is None else res.groups[:max_groups]
    for g in shown:
        lines.append(f"[{printable(str(g.tenant))}] {len(g.members)} memories -> 1"
                     + (f" (new id {printable(str(g.new_id))})" if g.new_id else ""))
        for m in g.members:
            created, text = res.previews.get(m, (None, ""))
            lines.append(f"    - {printable(str(m))}  {printable(str(created or '')[:10])}  {short(text)}")
        lines.append(f"    = {short(g.text)}")
    if len(shown) < len(res.groups):
        lines.append(f"... and {len(res.groups) - len(shown)} more merged memories")
    return "\n".join(lines)
