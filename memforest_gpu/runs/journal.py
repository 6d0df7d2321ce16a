"""A merge journal, so that a killed compression resumes without redoing finished merges.

:class:`JournaledMerger` wraps any merger. Every merge the inner merger completes is
appended to a JSON Lines file (and fsynced) before the engine sees it; on a resumed run
each pair found in the journal gets its recorded text without calling the inner merger.
The engine is deterministic given the texts, so replaying re-traces the same rounds and
reaches the same state; the pairs left are then sent on as usual. With a deterministic
merger the resumed output equals an uninterrupted run's.

Layout (one JSON object per line)::

    {"memforest_journal": 1, "fingerprint": "<sha256>", "parts": {...what it hashes...}}
    {"k": "<pair key>", "a": "<older id>", "b": "<newer id>", "text": "<merged text>"}
    ...

A pair's key hashes both inputs (ids, texts, timestamps, tenant), so a record is only
replayed for exactly the inputs it was made from. A torn last line (a kill during a
write) is cut off on resume. The fingerprint covers the input file's bytes, the config,
the embedder and the merger's identity (model, prompt version...): resuming with any
of them changed is refused, since the journaled texts would not belong to the new run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence

from ..mergers.base import MergePair
from ..store.atomic import fsync_dir

__all__ = ["JournaledMerger", "JournalWriteError", "JournalExistsError", "run_fingerprint", "journal_path",
           "JOURNAL_SUFFIX"]

#: what to do with a journal that cannot be read: it only saves work, so deleting it loses none of the data
_REMEDY = ("the journal only saves work: delete it to start over (its merges are made again), or fix the line if "
           "you know what it held")

log = logging.getLogger("memforest_gpu")

JOURNAL_SUFFIX = ".journal.jsonl"
_MAGIC = "memforest_journal"


class JournalWriteError(RuntimeError):
    """The journal at ``path`` could not be written (``reason``: disk full, folder gone,
    permissions...). Never a merger failure: the engine must not fall back and carry on
    without a journal."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(self.message("resume=True"))

    def __reduce__(self):  # travels between ranks (memforest_gpu.distributed.ranks)
        return type(self), (self.path, self.reason)

    def message(self, resume: str) -> str:
        """The message, naming the option that resumes the run ``resume``."""
        return (f"cannot write the merge journal {self.path!r}: {self.reason}; stopped before writing the output "
                f"(the merges journaled before this one are kept: fix the problem and rerun with {resume})")


class JournalExistsError(ValueError):
    """A run found the journal of an interrupted run (``path``) and was not asked to resume it."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(self.message("resume=True"))

    def __reduce__(self):  # travels between ranks (memforest_gpu.distributed.ranks)
        return type(self), (self.path,)

    def message(self, resume: str) -> str:
        """The message, naming the option that resumes the run ``resume``."""
        return (f"a merge journal of an interrupted run exists at {self.path!r}: pass {resume} to continue that run, "
                "or delete the file to start over")


def journal_path(output: str | os.PathLike, rank: int | None = None) -> str:
    """Where the journal of a run writing ``output`` lives: beside it (``OUT.journal.jsonl``);
    rank ``rank`` of a distributed run keeps its own (``OUT.rank1.journal.jsonl``)."""
    return os.fspath(output) + ("" if rank is None else f".rank{rank}") + JOURNAL_SUFFIX


def _file_digest(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def merger_identity(merger) -> dict:
    """What determines a merger's texts: its ``identity()`` when it has one, else name + repr."""
    ident = getattr(merger, "identity", None)
    if callable(ident):
        return ident()
    cls = type(merger)  # a default repr holds a memory address: use the class instead
    desc = repr(merger) if cls.__repr__ is not object.__repr__ else f"{cls.__module__}.{cls.__qualname__}"
    return {"name": getattr(merger, "name", cls.__name__), "repr": desc}


def run_fingerprint(input_path, config, merger, embedder: str | None, **more) -> dict:
    """The parts a journal must match to be resumed, with their hash under ``"fingerprint"``;
    ``more``: what else the run's merges depend on (a distributed run: its ``ranks`` and
    ``split_above``, which decide what each rank's journal holds)."""
    parts = {"input_sha256": _file_digest(input_path), "config": dataclasses.asdict(config),
             "merger": merger_identity(merger), "embedder": embedder, **more}
    return {"fingerprint": _digest(parts), "parts": json.loads(json.dumps(parts, default=str))}


def _digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _renamed_stage_matches(header: dict, fingerprint: str) -> bool:
    """Whether a journal written before the spanning stage was renamed (its config holds the
    stage as ``"tree"``) belongs to the run of ``fingerprint``: the same parts under the new
    name."""
    parts = header.get("parts")
    config = parts.get("config") if isinstance(parts, dict) else None
    if not isinstance(config, dict) or "tree" not in config or "spanning" in config:
        return False
    renamed = {**parts, "config": {("spanning" if k == "tree" else k): v for k, v in config.items()}}
    return _digest(renamed) == fingerprint


def pair_key(pair: MergePair) -> str:
    o, n = pair.older, pair.newer
    blob = json.dumps([pair.tenant, o.id, o.text, repr(float(o.timestamp)), n.id, n.text, repr(float(n.timestamp))],
                      ensure_ascii=False)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()


class JournaledMerger:
    """Wrap ``inner`` so that its merges are journaled at ``path`` and replayed on resume.

    Args:
        inner: any merger.
        path: the journal file (see :func:`journal_path`); created at the first merge.
        fingerprint: from :func:`run_fingerprint`.
        resume: continue an existing journal. Without it an existing journal is an error
            (a previous run was interrupted: resume it or delete the file).
        checkpoint_every: the pairs of a round go to ``inner`` in chunks of this many, each
            journaled when done, so a kill loses at most one chunk of work.

    ``stats``: ``replayed`` (merges taken from the journal), ``journaled`` (appended).
    """

    def __init__(self, inner, path: str | os.PathLike, *, fingerprint: dict, resume: bool = False,
                 checkpoint_every: int = 2048):
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.path = os.fspath(path)
        self.header = {_MAGIC: 1, **fingerprint}
        self.checkpoint_every = checkpoint_every
        self.done: dict[str, str] = {}
        self.stats = {"replayed": 0, "journaled": 0}
        self._f = None
        self.write_error: JournalWriteError | None = None
        if os.path.exists(self.path):
            if not resume:
                raise JournalExistsError(self.path)
            self._load()

    @property
    def fatal(self):
        """The inner merger's fatal error, or this journal's write error: either stops the run
        (the engine re-raises instead of falling back to the extractive merger)."""
        return self.write_error or getattr(self.inner, "fatal", None)

    def identity(self) -> dict:
        return merger_identity(self.inner)

    def unwrap(self):
        """The merger whose texts this journal records (the hook of
        :class:`~memforest_gpu.mergers.Merger`)."""
        return self.inner

    def _load(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        good = data.rfind(b"\n") + 1  # a line without its newline is torn
        lines = data[:good].split(b"\n")[:-1]
        header = None
        if lines:
            try:
                header = json.loads(lines[0])
            except ValueError:
                pass
        if not isinstance(header, dict) or _MAGIC not in header:
            if good == 0 or not lines[0].strip():  # killed while writing the header: start over
                log.info("journal %s has no complete header; starting it over", self.path)
                with open(self.path, "r+b") as f:
                    f.truncate(0)
                return
            raise ValueError(f"{self.path}: line 1 must be a memforest merge journal's header, got {lines[0][:80]!r}; "
                             f"{_REMEDY}")
        if header.get("fingerprint") != self.header["fingerprint"] and \
                not _renamed_stage_matches(header, self.header["fingerprint"]):
            old, new = header.get("parts", {}), self.header["parts"]
            diff = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)] or ["fingerprint"]
            raise ValueError(
                f"{self.path}: the journal belongs to another run (its {', '.join(diff)} differ from this "
                "run's); resume with the same input file, options and merger, or delete the journal to start over")
        for ln, raw in enumerate(lines[1:], 2):
            try:
                rec = json.loads(raw)
                if not isinstance(rec["k"], str) or not isinstance(rec["text"], str):
                    raise TypeError
                self.done[rec["k"]] = rec["text"]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{self.path}: line {ln} must be a journal record (an object with k, a, b and "
                                 f"text), got {raw[:80]!r}; {_REMEDY}") from None
        if good < len(data):
            log.info("journal %s: cutting a torn last line (%d bytes)", self.path, len(data) - good)
            with open(self.path, "r+b") as f:
                f.truncate(good)
        log.info("journal %s: %d merges to replay", self.path, len(self.done))

    def _append(self, records: list[dict]) -> None:
        new = self._f is None and not os.path.exists(self.path)
        if self._f is None:
            self._f = open(self.path, "ab")
            if new or self._f.tell() == 0:
                self._f.write(json.dumps(self.header, ensure_ascii=False).encode("utf-8") + b"\n")
        self._f.write(b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in records))
        self._f.flush()
        os.fsync(self._f.fileno())
        if new:
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self.stats["journaled"] += len(records)

    def merge(self, pairs: Sequence[MergePair]) -> list[str]:
        """Texts for ``pairs``: journaled ones replayed, the rest merged by ``inner`` and
        journaled."""
        pairs = list(pairs)
        keys = [pair_key(p) for p in pairs]
        out: list = [self.done.get(k) for k in keys]
        todo = [j for j, t in enumerate(out) if t is None]
        self.stats["replayed"] += len(pairs) - len(todo)
        for s in range(0, len(todo), self.checkpoint_every):
            chunk = todo[s:s + self.checkpoint_every]
            texts = list(self.inner.merge([pairs[j] for j in chunk]))
            if len(texts) != len(chunk):
                raise ValueError(f"merger must return one text per pair ({len(chunk)}), got {len(texts)}")
            recs = []
            for j, t in zip(chunk, texts):
                out[j] = t
                if isinstance(t, str) and t.strip():
                    recs.append({"k": keys[j], "a": pairs[j].older.id, "b": pairs[j].newer.id, "text": t})
            if recs and not self.fatal:  # a broken backend's fallbacks are not kept: redo them on resume
                try:
                    self._append(recs)
                except OSError as e:
                    self.write_error = JournalWriteError(self.path, str(e.strerror or e))
                    raise self.write_error from e
                self.done.update((r["k"], r["text"]) for r in recs)
        return out

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def finish(self) -> None:
        """The output is written: the journal is no longer needed."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
