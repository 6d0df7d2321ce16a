"""A distributed run keeps one journal per rank, as the single run keeps one: a run whose
merger fails partway is resumed, gives the uninterrupted run's output and report, and asks
no merger again for a pair a journal holds."""
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from memforest_gpu import CompressConfig, MergeConfig
from memforest_gpu.cli.flags import config_from_args
from memforest_gpu.distributed import RankFailedError, compress_file_distributed
from memforest_gpu.distributed.__main__ import build_parser
from memforest_gpu.distributed.__main__ import main as dist_main
from memforest_gpu.mergers import ExtractiveMerger
from memforest_gpu.runs import JournalExistsError, MergerFailedError, journal_path
from memforest_gpu.runs.journal import merger_identity
from memforest_gpu.store.io import write_store
from memforest_gpu.store.synthetic import synthetic_store

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

CFG = CompressConfig(merge=MergeConfig(ratio=0.5))


class Recording:
    """The extractive merger, recording every pair it is asked for; from call ``fail_at`` on it
    answers as an LLM merger whose server is down (fallback texts, ``fatal`` set)."""

    name = "extractive"

    def __init__(self, fail_at: int | None = None):
        self.inner, self.fail_at, self.calls, self.fatal = ExtractiveMerger(), fail_at, 0, None
        self.asked: list[list[str]] = []

    def identity(self):
        return merger_identity(self.inner)  # the CLI's extractive merger resumes this run's journal

    def merge(self, pairs):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            self.fatal = "connection refused"
        else:
            self.asked += [[p.older.id, p.newer.id] for p in pairs]
        return self.inner.merge(pairs)


def _records(path) -> list[list[str]]:
    with open(path) as f:
        return [[r["a"], r["b"]] for r in map(json.loads, f.read().splitlines()[1:])]


def _figures(report) -> dict:
    d = json.loads(json.dumps(report.to_dict(), default=str))
    del d["seconds"]
    return d


def _worker(rank, world, init_file, tmp):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    seen: dict = {}
    try:
        torch.set_num_threads(1)
        src, ref, out = (os.path.join(tmp, n) for n in ("in.parquet", "ref.parquet", "out.parquet"))

        def run(dst, merger, **kw):
            return compress_file_distributed(src, dst, CFG, merger=merger, embedder="none", split_above=50, **kw)

        full = Recording()
        res = run(ref, full)
        seen["full"] = full.asked
        if rank == 0:
            assert res.split and all(res.plan)  # a split tenant, and work on both ranks
            seen["ref_report"] = _figures(res.report)

        # rank 1's merger goes down at its second call: every rank stops, the journals stay
        first = Recording(fail_at=2 if rank == 1 else None)
        with pytest.raises((MergerFailedError, RankFailedError)) as e:
            run(out, first)
        seen["error"] = [type(e.value).__name__, str(e.value)]
        if rank == 0:
            assert isinstance(e.value.error, MergerFailedError) and e.value.rank == 1
        assert not os.path.exists(out)
        seen["journaled"] = _records(journal_path(out, rank))

        with pytest.raises(JournalExistsError, match="pass resume=True"):  # every rank refuses, before any work
            run(out, Recording())

        second = Recording()
        res = run(out, second, resume=True)
        seen["resumed"] = second.asked
        assert not os.path.exists(journal_path(out, rank))  # deleted once the output is written
        if rank == 0:
            seen["report"], seen["replayed"] = _figures(res.report), res.replayed
    finally:
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump(seen, f)
        dist.destroy_process_group()


def test_a_distributed_run_whose_merger_failed_resumes_from_its_journals(tmp_path):
    write_store(synthetic_store(200, tenants=4, dim=16, seed=2, big_tenant_share=0.5), tmp_path / "in.parquet")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    assert (tmp_path / "out.parquet").read_bytes() == (tmp_path / "ref.parquet").read_bytes()
    assert ranks[0]["report"] == ranks[0]["ref_report"]
    assert ranks[1]["error"][0] == "MergerFailedError" and ranks[0]["error"][0] == "RankFailedError"
    assert "resume=True" in ranks[1]["error"][1] and "--" not in ranks[1]["error"][1]
    journaled = [tuple(p) for r in ranks for p in r["journaled"]]
    resumed = [tuple(p) for r in ranks for p in r["resumed"]]
    assert len(ranks[1]["journaled"]) > 0 and len(ranks[0]["journaled"]) > 0 and resumed
    assert not set(journaled) & set(resumed)  # no journaled pair was asked for again
    assert sorted(journaled + resumed) == sorted(tuple(p) for r in ranks for p in r["full"])
    assert ranks[0]["replayed"] == len(journaled)


def test_the_command_resumes_with_its_flag(tmp_path, capsys):
    """One rank (no torchrun): a journal left by a failed run is refused naming --resume, and
    ``--resume`` continues it with the command's own extractive merger."""
    src, out, ref = tmp_path / "in.parquet", tmp_path / "out.parquet", tmp_path / "ref.parquet"
    write_store(synthetic_store(120, tenants=3, dim=16, seed=4), src)
    args = ["compress", str(src), "--embedder", "none", "--device", "cpu", "--ratio", "0.5", "--quiet"]
    cfg = config_from_args(build_parser().parse_args([*args[:2], str(out), *args[2:]]))  # the command's config
    with pytest.raises(MergerFailedError):
        compress_file_distributed(src, out, cfg, embedder="none", merger=Recording(fail_at=2))
    journaled = len(_records(journal_path(out, 0)))
    assert journaled > 0

    assert dist_main([*args[:2], str(out), *args[2:]]) == 2
    err = capsys.readouterr().err
    assert "--resume to continue that run" in err and "resume=True" not in err
    assert dist_main([*args[:2], str(out), *args[2:], "--resume"]) == 0
    assert f"resumed: {journaled} merges replayed" in capsys.readouterr().out
    assert dist_main([*args[:2], str(ref), *args[2:]]) == 0
    assert out.read_bytes() == ref.read_bytes() and not os.path.exists(journal_path(out, 0))
