"""``--review`` on ``mem0 compress --dry-run`` and ``mem0 compact --dry-run``: a page of the
scope's merges (compress) or first-round plan (compact), over a real embedded Qdrant store
(the setup of tests/test_mem0_adapter.py)."""
import json

import pytest
from extras import need
from test_mem0_adapter import _config, _fill  # first: it turns Mem0's and Chroma's telemetry off, then imports mem0

need("qdrant_client")
need("plotly")
yaml = need("yaml")

from memforest_gpu.adapters.mem0.inplace import close_memory, load_memory  # noqa: E402
from memforest_gpu.cli.adapters import main  # noqa: E402


def _data(page):
    text = page.read_text(encoding="utf-8")
    tag = '<script type="application/json" id="review-data">'
    start = text.index(tag) + len(tag)
    return json.loads(text[start:text.index("</script>", start)])


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("mem0review")
    cfg = _config(str(root))
    path = root / "mem0.yaml"
    path.write_text(yaml.safe_dump(cfg))
    m = load_memory(cfg, create=True)
    _fill(m, "fred", 12)
    _fill(m, "gina", 12)
    close_memory(m)
    return path


def test_mem0_dry_runs_write_a_review_page(config, tmp_path, capsys):
    page = tmp_path / "c.html"
    assert main(["mem0", "compress", "--config", str(config), "--user-id", "fred", "--ratio", "0.5", "--dry-run",
                 "--review", str(page)]) == 0
    d = _data(page)
    assert d["summary"]["command"] == "mem0 compress --dry-run" and not d["summary"]["planned"]
    assert d["summary"]["nodes_in"] == 12 and d["summary"]["nodes_out"] == 6
    assert d["summary"]["ratio_asked"] == 0.5 and d["summary"]["asked_share"] == 0.5  # --ratio, and 6 of 12
    assert {n["tenant"] for n in d["nodes"]} == {"user_id=fred"}
    assert all(len(n["members"]) >= 2 and n["text"] for n in d["nodes"])
    page2 = tmp_path / "k.html"
    assert main(["mem0", "compact", "--config", str(config), "--max-per-user", "8", "--dry-run",
                 "--review", str(page2)]) == 0
    d2 = _data(page2)
    assert d2["summary"]["planned"] and d2["nodes"]
    assert {n["tenant"] for n in d2["nodes"]} <= {"user_id=fred", "user_id=gina"}
    assert all(n["size"] == 2 and n["text"] is None for n in d2["nodes"])
    capsys.readouterr()
    assert main(["mem0", "compress", "--config", str(config), "--user-id", "fred", "--dry-run",
                 "--review", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--review" in err, err
