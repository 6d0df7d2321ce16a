"""The user-facing Python API: load, compress, save, search (the CLI calls only these)."""
from __future__ import annotations

import logging
from pathlib import Path

from .config import CompressConfig
from .embedders import SentenceTransformerEmbedder, get_embedder
from .engine import CompressResult, PlanResult, compress, plan
from .io import read_store, write_store
from .journal import JournaledMerger, journal_path, run_fingerprint
from .mergers import get_merger
from .store import MemoryStore

__all__ = ["load_store", "compress_file", "plan_file", "resolve_embedder"]

log = logging.getLogger("memforest_gpu")


def resolve_embedder(spec: str, store_embedder: str | None, *, device=None):
    """``auto`` re-embeds with the store's recorded model when it can be loaded locally,
    else warns and falls back to the normalised mean of the merged vectors."""
    emb = get_embedder(spec, device=device, store_embedder=store_embedder)
    if emb is None and spec == "auto":
        log.warning("the model behind this store's vectors is %s; merged nodes get the normalised mean of "
                    "their inputs' vectors (pass --embedder PATH to re-embed merged text instead)",
                    repr(store_embedder) if store_embedder else "not recorded")
    return emb


def load_store(path: str | Path, *, embedder: str = "auto", device=None, format: str | None = None) -> MemoryStore:
    """Read a store; a file without embeddings is embedded on load (``auto``: the default model)."""
    model = None
    if embedder not in ("none",):
        model = get_embedder("default" if embedder == "auto" else embedder, device=device)
    return read_store(path, format=format, embedder=model, device=device)


def compress_file(src: str | Path, dst: str | Path, config: CompressConfig, *, embedder: str = "auto",
                  merger="extractive", merger_options: dict | None = None, device=None, progress: bool = True,
                  format: str | None = None, out_format: str | None = None, resume: bool = False,
                  journal: bool = True) -> CompressResult:
    """Read ``src``, compress, write ``dst`` atomically.

    ``merger``: a name for :func:`~memforest_gpu.mergers.get_merger` (with
    ``merger_options``) or a merger object (its ``stats`` then hold the LLM counters and,
    on a resumed run, ``replayed``: the merges taken from the journal).

    With ``journal`` (default) every finished merge is appended to ``dst + ".journal.jsonl"``;
    the journal is deleted once ``dst`` is written. After a crash, ``resume=True``
    continues from it (see :mod:`memforest_gpu.journal`); without ``resume`` an existing
    journal is an error. ``dst`` itself is only ever written whole, at the end.

    An LLM merger whose every request of a round failed (server down, bad key) stops the run
    after that round with a ``ValueError``; the merges made so far stay journaled.
    """
    if isinstance(merger, str):
        merger = get_merger(merger, **(merger_options or {}))
    elif merger_options:
        raise ValueError(f"merger_options must be empty when merger is an object, got {sorted(merger_options)}")
    store = load_store(src, embedder=embedder, device=device, format=format)
    emb = resolve_embedder(embedder, store.embedder, device=device)
    run_merger = merger
    if journal:
        fp = run_fingerprint(src, config, merger, emb.name if emb is not None else "mean-of-inputs")
        run_merger = JournaledMerger(merger, journal_path(dst), fingerprint=fp, resume=resume)
    load = getattr(merger, "load", None)
    if callable(load):
        load()  # a model that cannot load fails here, not as fallbacks inside the engine

    def stop_if_broken(rnd: int, merges: list) -> None:
        err = getattr(merger, "fatal", None)
        if err:
            where = f"; the {run_merger.stats['journaled']} merges before it are journaled in " \
                    f"{run_merger.path!r}, rerun with --resume once it is fixed" if journal else ""
            raise ValueError(f"the {merger.name} merger failed on every request of round {rnd}: {err}; "
                             f"stopped{where}")

    try:
        result = compress(store, config, merger=run_merger, embedder=emb, device=device, progress=progress,
                          on_round=stop_if_broken)
        write_store(result.store, dst, format=out_format)
    finally:
        if journal:
            run_merger.close()
    if journal:
        run_merger.finish()
        if isinstance(getattr(merger, "stats", None), dict):
            merger.stats["replayed"] = run_merger.stats["replayed"]
    return result


def plan_file(src: str | Path, config: CompressConfig, *, embedder: str = "auto", device=None,
              format: str | None = None) -> PlanResult:
    """A dry run: the first round's planned merges (``result.records``: tenant, a, b,
    similarity; ``result.pairs``: their texts). Merges nothing and writes nothing."""
    store = load_store(src, embedder=embedder, device=device, format=format)
    emb = resolve_embedder(embedder, store.embedder, device=device)
    return plan(store, config, embedder=emb, device=device)
