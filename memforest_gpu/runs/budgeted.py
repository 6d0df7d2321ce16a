"""Compress a store bigger than memory: tenant groups that fit a memory budget, one at a time.

Tenants never interact (docs/method.md), so compressing a subset of whole tenants gives exactly the
rows the whole-store run gives for them. :func:`compress_budgeted` therefore

1. scans only the tenant column (:func:`scan_tenants`) and packs groups of whole tenants
   whose estimated working set fits the budget (:func:`pack_groups`; a tenant that is too
   big on its own gets a group of its own and a warning saying by how much);
2. splits the input into one file per group in a single streamed pass (``OUT.parts/``);
3. compresses each group with the same config, seed, merger and journal, and writes its
   output to an Arrow IPC part with each node's *key*: the input row of the earliest
   original it holds (the in-memory run's output order);
4. writes the output in batches, in key order, reading the parts batch by batch.

The journal (``OUT.journal.jsonl``) is shared by every group, so Ctrl-C and ``--resume``
work as in the in-memory run; a group whose part is written is not redone on resume.

Planning (sizes, the per-node estimate, the tenant scan, groups) is :mod:`.budget_groups`;
the run's files (split inputs, parts, the final write) are :mod:`.budget_files`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..mergers import get_merger
from ..report import CompressReport
from ..sizes import format_size
from ..store.atomic import atomic_write_text
from ..store.io import detect_format, read_store
from ..timer import StageTimer
from .budget_files import _output_keys, _split_jsonl, _split_parquet, _write_output, _write_part
from .budget_groups import TenantScan, group_capacity, node_bytes, pack_groups, parts_dir, scan_tenants
from .driver import MergerRun, run_locked
from .errors import OPTION_WORDS  # noqa: F401 (the logger's filter writes {memory_budget} in the caller's words)
from .journal import merger_identity
from .loading import RunInterrupted, load_store_and_embedder

__all__ = ["compress_budgeted", "compress_file_budgeted", "BudgetedResult"]

log = logging.getLogger("memforest_gpu")


# -------------------------------------------------------------------------- compress
@dataclass
class BudgetedResult:
    """What :func:`compress_budgeted` did: the merged ``report`` (per-tenant rows in the
    in-memory run's order) and the groups (``groups``: tenants and nodes per group)."""

    report: object
    groups: list[dict]
    reused: int = 0  # groups whose part a resumed run found done


def _run_key(src: str, config, merger, embedder_spec: str, groups: list[list[str]]) -> str:
    """What the parts of a run depend on: the input file (size, mtime), config, merger,
    ``--embedder`` and the groups; a resumed run reuses parts only when it matches."""

    st = os.stat(src)
    blob = json.dumps({"input": [os.path.abspath(src), st.st_size, st.st_mtime_ns],
                       "config": dataclasses.asdict(config), "merger": merger_identity(merger),
                       "embedder": embedder_spec, "groups": groups}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _read_state(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_json(path: str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, default=str))


def compress_budgeted(src: str, dst: str, config, *, memory_budget: int, embedder: str = "auto",
                      merger=None, device=None, progress: bool = False, format: str | None = None,
                      out_format: str | None = None, resume: bool = False,
                      echo: Callable[[str], None] | None = None) -> BudgetedResult:
    """Compress ``src`` into ``dst`` holding one group of tenants at a time (see the module
    docstring); the output file equals the in-memory run's for the same config and seed.

    ``memory_budget``: bytes for a group's working set (:func:`node_bytes` per node) plus
    the process baseline. The caller checks ``dst`` and holds its lock
    (:func:`compress_file_budgeted` does both). ``echo``: one line per group
    (progress). Ctrl-C raises :class:`~memforest_gpu.runs.loading.RunInterrupted` saying what
    is kept.
    """

    timer = StageTimer()
    config = dataclasses.replace(config, memory_budget=memory_budget)  # the partition's blocks follow it
    say = echo or (lambda s: log.info("%s", s))
    fmt = detect_format(src, format)
    out_fmt = detect_format(dst, out_format)
    merger = merger if merger is not None else get_merger("extractive")
    run = MergerRun(src, dst, config, merger, resume=resume)  # refuses a journal left without resume
    scan = scan_tenants(src, fmt)
    if not len(scan.row_tenant):
        raise ValueError(f"{src}: store must have at least one node, got 0 nodes")
    groups = _pack(scan, memory_budget, say)
    group_names = [[scan.names[t] for t in g.tolist()] for g in groups]
    parts = _Parts(dst, fmt, len(groups), _run_key(src, config, merger, embedder, group_names), resume, say)
    row_group = _split_input(src, fmt, scan, groups, parts, say)
    if parts.reused:
        say(f"resuming: {parts.reused} of {len(groups)} group(s) already done")
    runner = _GroupRunner(run, embedder, device, progress)
    try:
        _run_groups(runner, groups, scan, row_group, parts, fmt, say)
    except KeyboardInterrupt:
        finished = sum(os.path.exists(p + ".json") and os.path.exists(p) for p in parts.out_paths)
        raise RunInterrupted(f"interrupted; {finished} of {len(groups)} tenant groups are done in {parts.work!r} and "
                             f"{run.journaled()} merges are journaled in {run.path!r}", resumable=True) from None
    finally:
        run.close()

    timer.lap("groups")
    reports = [_read_state(p + ".json") for p in parts.out_paths]
    time_format = "iso" if all(r.get("time_format") == "iso" for r in reports) else None
    _write_output(parts.out_paths, dst, out_fmt, time_format, memory_budget)
    report = _merged_report(reports, scan, timer)
    run.finish()
    shutil.rmtree(parts.work, ignore_errors=True)
    sizes = [{"tenants": len(g), "nodes": int(scan.sizes[g].sum())} for g in groups]
    return BudgetedResult(report, sizes, parts.reused)


def _pack(scan: TenantScan, memory_budget: int, say) -> list[np.ndarray]:
    """The groups of whole tenants that fit the budget (a warning for each tenant too big alone)."""
    per_node = node_bytes(scan.dim)
    cap = group_capacity(memory_budget)
    groups, over = pack_groups(scan.sizes, per_node, cap)
    for t, need in over[:5]:
        log.warning("tenant %r has %d nodes, about %s of working set: %s over the group capacity of "
                    "{memory_budget} %s; it is compressed alone", scan.names[t], int(scan.sizes[t]),
                    format_size(need), format_size(need - cap), format_size(memory_budget))
    if len(over) > 5:
        log.warning("... and %d more tenants over the group capacity, each compressed alone", len(over) - 5)
    say(f"memory budget {format_size(memory_budget)}: {len(scan.row_tenant)} nodes, {len(scan.names)} tenants, "
        f"about {format_size(per_node)} a node -> {len(groups)} group(s)")
    return groups


class _Parts:
    """The run's folder beside the output (``OUT.parts/``): its state (``state.json``: the run
    key, whether the input is split, which groups' vectors are all unit length), the groups'
    input files and their output parts. A resumed run keeps the folder only when its key
    matches; ``done`` marks the groups whose part is already written."""

    def __init__(self, dst: str, fmt: str, n_groups: int, key: str, resume: bool, say):
        self.work = parts_dir(dst)
        self.state_path = os.path.join(self.work, "state.json")
        self.state = _read_state(self.state_path) if resume else {}
        if self.state.get("key") != key:
            if os.path.exists(self.work):
                if resume and self.state:
                    say("the parts of the interrupted run belong to another plan or input: starting the groups over "
                        "(journaled merges are still replayed)")
                shutil.rmtree(self.work)
            self.state = {"key": key, "split": False}
        os.makedirs(self.work, exist_ok=True)
        ext = ".parquet" if fmt == "parquet" else ".jsonl"
        self.in_paths = [os.path.join(self.work, f"in-{g}{ext}") for g in range(n_groups)]
        self.out_paths = [os.path.join(self.work, f"out-{g}.arrow") for g in range(n_groups)]
        self.done = [os.path.exists(p) and os.path.exists(p + ".json") for p in self.out_paths]
        self.reused = sum(self.done)

    def save(self) -> None:
        _write_json(self.state_path, self.state)


def _split_input(src: str, fmt: str, scan: TenantScan, groups: list[np.ndarray], parts: _Parts, say) -> np.ndarray:
    """Split the input into one file per group (once: a resumed run reuses the split), recording
    which groups' vectors are all unit length. Returns the group of each input row (N,)."""
    tenant_group = np.empty(len(scan.names), dtype=np.int64)
    for g, codes in enumerate(groups):
        tenant_group[codes] = g
    row_group = tenant_group[scan.row_tenant]  # (N,)
    if not parts.state["split"] and not all(parts.done):
        timer = StageTimer()
        if fmt == "parquet":
            unit = _split_parquet(src, row_group, len(groups), parts.in_paths)
        else:
            unit = _split_jsonl(src, scan.header, row_group, len(groups), parts.in_paths)
        parts.state["split"] = True
        parts.state["unit"] = unit.tolist()
        parts.save()
        say(f"split the input into {len(groups)} group file(s) in {timer.finish()['total']:.1f}s")
    elif not parts.state.get("split"):
        parts.save()
    return row_group


def _run_groups(runner, groups: list[np.ndarray], scan: TenantScan, row_group: np.ndarray, parts: _Parts, fmt: str,
                say) -> None:
    """Compress each group not done yet and write its part (keyed by input row)."""
    unit = parts.state.get("unit") or [True] * len(groups)
    # the in-memory run normalises every vector unless all are unit length already
    renormalise = [not all(unit) and u for u in unit]
    for g, codes in enumerate(groups):
        if parts.done[g]:
            continue
        n_g = int(scan.sizes[codes].sum())
        timer = StageTimer()
        res, sub = runner.run(parts.in_paths[g], fmt, renormalise[g])
        keys = _output_keys(sub, res.store, np.flatnonzero(row_group == g))
        _write_part(res.store, keys, parts.out_paths[g], res.report, sub.time_format)
        os.unlink(parts.in_paths[g])
        say(f"group {g + 1}/{len(groups)}: {len(codes)} tenant(s), {n_g} nodes -> {res.report.nodes_out} "
            f"in {timer.finish()['total']:.1f}s")
        del res, sub


class _GroupRunner:
    """Loads each group's store and compresses it with the run's merger and journal; one
    embedder for all (resolved with the first group's store, as the in-memory run does)."""

    def __init__(self, run: MergerRun, embedder, device, progress):
        self.run_, self.spec, self.device, self.progress = run, embedder, device, progress
        self.emb = None
        self.label = None
        self.loaded = False

    def _load(self, path: str, fmt: str):
        if not self.loaded:
            store, self.emb = load_store_and_embedder(path, embedder=self.spec, device=self.device, format=fmt)
            self.label, self.loaded = store.embedder, True
            return store
        store = read_store(path, format=fmt, embedder=self.emb, device=self.device)
        if self.label is not None and store.embedder != self.label:
            store = dataclasses.replace(store, embedder=self.label)  # as load_store_and_embedder names it
        return store

    def run(self, path: str, fmt: str, renormalise: bool = False):
        store = self._load(path, fmt)
        if renormalise:  # the whole store's vectors are normalised in memory: the same division here
            e = store.embeddings.double()
            store = dataclasses.replace(store, embeddings=(e / e.norm(dim=1)[:, None]).to(store.embeddings.dtype))
        res = self.run_.compress(store, self.emb, device=self.device, progress=self.progress)
        return res, store  # store: sources only after (its vectors are the output's)


def _merged_report(reports: list[dict], scan: TenantScan, timer: StageTimer) -> CompressReport:
    """One report from the groups' reports (:meth:`~memforest_gpu.report.CompressReport.combine`),
    tenants in the in-memory run's order (first appearance in the input); the output's
    seconds are the groups' and the final write's."""
    report = CompressReport.combine([CompressReport.from_dict(r) for r in reports], order=scan.names)
    timer.lap("write")
    report.seconds["output"] = report.seconds.get("output", 0.0) + timer.seconds["write"]
    report.seconds["total"] = timer.finish()["total"]
    return report


def compress_file_budgeted(src, dst, config, *, memory_budget: int, embedder: str = "auto", merger="extractive",
                           merger_options: dict | None = None, device=None, progress: bool = False,
                           format: str | None = None, out_format: str | None = None, resume: bool = False,
                           echo: Callable[[str], None] | None = None) -> BudgetedResult:
    """:func:`~memforest_gpu.runs.single.compress_in_memory` within ``memory_budget`` bytes:
    the same
    checks before any work, the same lock (``OUT.lock``) and journal, the same output."""

    def run(src: str, dst: str, merger) -> BudgetedResult:
        return compress_budgeted(src, dst, config, memory_budget=memory_budget, embedder=embedder, merger=merger,
                                 device=device, progress=progress, format=format, out_format=out_format,
                                 resume=resume, echo=echo)

    return run_locked(src, dst, run, merger=merger, merger_options=merger_options, format=format,
                      out_format=out_format, parts=True)
