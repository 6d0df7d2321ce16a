"""The review page (``memforest review``, ``--review``): its data without a browser, then the
page itself in headless Chromium (tests/browser.py): no script errors, the filters, the
figures against the run's report, texts shown as text, and the path checks."""
import json

import numpy as np
import pytest
from extras import need

from memforest_gpu.cli import main
from memforest_gpu.engine.output import MergeRecord
from memforest_gpu.review import Limits, groups_from_merges, groups_from_stores, load_columns, review_data
from memforest_gpu.review.data import dropped_spans
from memforest_gpu.review.page import embed_json
from memforest_gpu.store.synthetic import synthetic_store

XSS = "<script>alert(1)</script> and <img src=x onerror=alert(2)> ride the quokka"
SPEAKERS = ["Ann", "Ben"]


def _write_store(path, n=240, tenants=3, seed=0):
    st = synthetic_store(n, tenants=tenants, dim=16, seed=seed)
    names = ["ann", "ben", "cyd", "dee"]
    with open(path, "w", encoding="utf-8") as f:
        for j, r in enumerate(st.records()):
            rec = {"id": r["id"], "text": r["text"], "timestamp": r["timestamp"] + j * 3600 * 7,
                   "tenant": names[int(r["tenant"].split("-")[-1]) % 4] if "-" in r["tenant"] else r["tenant"],
                   "embedding": [round(float(x), 6) for x in r["embedding"]],
                   "metadata": {"speaker": SPEAKERS[j % 2], "session": j // 10}}
            if j == 5:
                rec["text"] = XSS
            f.write(json.dumps(rec) + "\n")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One compression of a small store with --report and --review, and its dry run."""
    need("plotly")  # the page's plots (the [review] extra)
    d = tmp_path_factory.mktemp("review")
    src = _write_store(d / "in.jsonl")
    out, rep, page, dry = d / "out.jsonl", d / "rep.json", d / "page.html", d / "dry.html"
    assert main(["compress", str(src), str(out), "--ratio", "0.5", "--embedder", "none", "--quiet",
                 "--report", str(rep), "--review", str(page)]) == 0
    assert main(["compress", str(src), str(out) + ".x.jsonl", "--ratio", "0.5", "--embedder", "none",
                 "--dry-run", "--review", str(dry)]) == 0
    return {"dir": d, "src": src, "out": out, "report": json.loads(rep.read_text()), "report_path": rep,
            "page": page, "dry": dry}


def _data(page):
    text = page.read_text(encoding="utf-8")
    start = text.index('<script type="application/json" id="review-data">') + len(
        '<script type="application/json" id="review-data">')
    return json.loads(text[start:text.index("</script>", start)])


# ---------------------------------------------------------------------------------------- data


def test_embedded_json_cannot_end_its_script_element():
    data = {"t": "</script><script>alert(1)</script><!-- \u2028 &"}
    s = embed_json(data)
    assert "<" not in s and ">" not in s and "&" not in s and "\u2028" not in s
    assert json.loads(s) == data


def test_merge_log_groups_and_weakest_similarity(tmp_path):
    before = load_columns(str(_write_store(tmp_path / "s.jsonl", n=12, tenants=1)))
    ids = list(before.ids)
    log = [MergeRecord(1, "default", ids[0], ids[1], 0.9, "m1", "x"),
           MergeRecord(1, "default", ids[2], ids[3], 0.8, "m2", "y"),
           MergeRecord(2, "default", "m1", ids[4], 0.4, "m3", "z")]
    g = groups_from_merges(before, log)
    assert len(g) == 2
    got = {g.ids[k]: (sorted(g.rows[g.start[k]:g.start[k + 1]].tolist()), g.similarity[k], g.merges[k], g.text[k])
           for k in range(len(g))}
    assert got["m3"] == ([0, 1, 4], 0.4, 2, "z") and got["m2"] == ([2, 3], 0.8, 1, "y")


def test_stores_and_merge_log_agree(run):
    """The page from the two files finds the same merged nodes as the run's merge log, with the
    same similarity for every two-source node."""
    before = load_columns(str(run["src"]), vectors=True)
    after = load_columns(str(run["out"]))
    g = groups_from_stores(before, after)
    page = _data(run["page"])
    assert len(g) == page["sample"]["of"] == len(page["nodes"])
    by_id = {n["id"]: n for n in page["nodes"]}
    for k in range(len(g)):
        n = by_id[g.ids[k]]
        assert sorted(m["id"] for m in n["members"]) == sorted(before.ids[r] for r in
                                                               g.rows[g.start[k]:g.start[k + 1]])
        if n["size"] == 2:
            assert abs(n["sim"] - g.similarity[k]) < 1e-3


def test_dropped_sentences_are_found():
    text = "Ann rode the quokka. Ann ate 3 mangoes in May. Ann slept."
    spans = dropped_spans(text, "[1 May 2024] Ann rode the quokka. Ann slept.")
    assert [text[a:b] for a, b in spans] == ["Ann ate 3 mangoes in May."]
    assert dropped_spans(text, None) == []


def test_big_runs_are_sampled_within_limits(tmp_path):
    """Many tenants: every tenant keeps its summary row, the largest are listed in full, the
    others up to per_tenant, within max_nodes; the rule is stated."""
    st = synthetic_store(3000, tenants=300, dim=8, seed=1, big_tenant_share=0.3)
    from memforest_gpu import CompressConfig, MergeConfig, compress
    res = compress(st, CompressConfig(merge=MergeConfig(ratio=0.5)))
    lim = Limits(max_nodes=400, per_tenant=1, full_tenants=1, full_limit=1000)
    data = review_data(st, groups_from_merges(st, res.merges), command="compress", report=res.report.to_dict(),
                       limits=lim)
    assert len(data["tenants"]["tenant"]) == 300
    assert data["sample"]["of"] == len(groups_from_merges(st, res.merges)) > 400
    assert len(data["nodes"]) == 400
    big = max(res.report.tenants, key=lambda t: t["nodes_in"])["tenant"]
    shown = [n["tenant"] for n in data["nodes"]]
    assert shown.count(big) == sum(1 for t in groups_from_merges(st, res.merges).tenant if t == big)
    assert all(shown.count(t) <= 1 for t in set(shown) - {big})
    assert "largest tenants" in data["sample"]["rule"] or "largest tenant" in data["sample"]["rule"]
    assert data["summary"]["nodes_in"] == res.report.nodes_in and data["summary"]["nodes_out"] == res.report.nodes_out
    assert sum(data["plots"]["size"]["y"]) == data["sample"]["of"]


# ---------------------------------------------------------------------------------------- CLI checks


@pytest.mark.parametrize("which", ["input", "output", "report", "lock", "journal"])
def test_review_path_is_checked_like_every_output(run, tmp_path, capsys, which):
    src, out = str(run["src"]), str(tmp_path / "o.jsonl")
    target = {"input": src, "output": out, "report": str(tmp_path / "r.json"), "lock": out + ".lock",
              "journal": out + ".journal.jsonl"}[which]
    argv = ["compress", src, out, "--embedder", "none", "--quiet", "--review", target]
    if which == "report":
        argv += ["--report", target]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--review must not be" in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_compact_review_refuses_the_store_and_the_inbox(tmp_path, capsys):
    store = _write_store(tmp_path / "s.jsonl", n=60)
    for target, dry in ((store, False), (str(store) + ".inbox.jsonl", False), (store, True)):
        argv = ["compact", str(store), "--max-nodes-per-tenant", "10", "--embedder", "none", "--review", str(target)]
        assert main(argv + (["--dry-run"] if dry else [])) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--review must not be" in err, err


def test_review_must_be_html_and_review_out_is_checked(run, tmp_path, capsys):
    assert main(["compress", str(run["src"]), str(tmp_path / "o.jsonl"), "--review", str(tmp_path / "p.txt")]) == 2
    assert "--review must be an .html file" in capsys.readouterr().err
    assert main(["review", str(run["src"]), str(run["out"]), "--out", str(run["src"])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out must not be" in err


# ---------------------------------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def browser():
    from browser import chromium
    d = chromium()
    yield d
    d.quit()


def _open(browser, page):
    from browser import open_page, page_errors
    open_page(browser, str(page))
    errs = page_errors(browser)
    assert errs == [], errs


def _visible_nodes(browser):
    return browser.execute_script(
        "return [...document.querySelectorAll('#nodes .node')].map(e => [e.dataset.tenant, e.dataset.id])")


def test_page_renders_with_every_figure_of_the_report(run, browser):
    need("selenium")
    _open(browser, run["page"])
    rep = run["report"]
    got = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#summary .card')]"
        ".map(e => [e.id.slice(4), e.dataset.value]))")
    for k in ("nodes_in", "nodes_out", "shortfall", "merges", "rounds", "condensed", "condensed_tokens", "fallbacks"):
        assert float(got[k]) == rep[k], k
    assert float(got["removed"]) == rep["nodes_in"] - rep["nodes_out"]
    assert abs(float(got["ratio_reached"]) - rep["ratio_reached"]) < 1e-12
    assert float(got["asked"]) == sum(t["requested"] for t in rep["tenants"])
    assert float(got["rows"]) == rep["size_out"]["rows"] and float(got["bytes"]) == rep["size_out"]["bytes"]
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#tenant-table tbody tr')].map(r => [r.dataset.tenant, "
        "...[...r.querySelectorAll('td[data-col]')].map(c => c.textContent)])")
    cols = browser.execute_script("return [...document.querySelectorAll('#tenant-table th')].map(h => h.dataset.col)")
    by = {t["tenant"]: t for t in rep["tenants"]}
    assert sorted(r[0] for r in rows) == sorted(by)
    for r in rows:
        cells = dict(zip(cols[1:], r[1:]))
        t = by[r[0]]
        for c, k in (("nodes_in", "nodes_in"), ("nodes_out", "nodes_out"), ("asked", "requested"),
                     ("removed", "removed"), ("shortfall", "shortfall")):
            assert int(cells[c].replace(",", "")) == t[k], (r[0], c)
        assert cells["ratio"] == f"{t['ratio']:.3f}"
    stages = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#stages tr')].map(r => [r.dataset.stage, "
        "r.cells[1].textContent]))")
    assert stages == {k: f"{v:.2f} s" for k, v in rep["seconds"].items()}
    assert browser.execute_script("return document.querySelectorAll('.plot .main-svg').length") >= 4


def test_tenant_filter_shows_only_that_tenant(run, browser):
    _open(browser, run["page"])
    browser.find_element("id", "filter-tenant").send_keys("ben")
    nodes = _visible_nodes(browser)
    assert nodes and {t for t, _ in nodes} == {"ben"}
    assert len(nodes) == min(25, sum(1 for n in _data(run["page"])["nodes"] if n["tenant"] == "ben"))


def test_text_filter_finds_a_merged_node_by_a_sources_words(run, browser):
    data = _data(run["page"])
    node = next(n for n in data["nodes"] if n["tenant"] == "cyd" and n["size"] >= 2)
    words = " ".join(node["members"][-1]["text"].split()[:6])
    _open(browser, run["page"])
    box = browser.find_element("id", "filter-text")
    box.send_keys(words)
    nodes = _visible_nodes(browser)
    assert [node["tenant"], node["id"]] in nodes
    want = [n for n in data["nodes"] if all(w in ((n["text"] or "") + "\n" + "\n".join(m["text"] for m in n[
        "members"])).lower() for w in words.lower().split())]
    assert len(nodes) == min(25, len(want))


def test_memory_text_is_shown_as_text_never_run(run, browser):
    _open(browser, run["page"])  # an alert would be recorded as an error (tests/browser.py)
    box = browser.find_element("id", "filter-text")
    box.send_keys("quokka")
    texts = browser.execute_script("return [...document.querySelectorAll('#nodes .source-text')]"
                                   ".map(e => e.textContent)")
    assert XSS in texts
    assert browser.execute_script("return document.querySelectorAll('#nodes img, #nodes script').length") == 0
    from browser import page_errors
    assert page_errors(browser) == []


def test_dry_run_page_shows_the_planned_pairs(run, browser, capsys):
    data = _data(run["dry"])
    assert data["summary"]["planned"] and data["nodes"]
    assert all(n["text"] is None and n["size"] == 2 for n in data["nodes"])
    _open(browser, run["dry"])
    assert browser.find_element("id", "nodes-title").text == "Planned pairs (first round)"
    # nothing was removed yet: no removed, ratio reached or shortfall columns, no "merged" title
    cols = browser.execute_script("return [...document.querySelectorAll('#tenant-table th')].map(h => h.dataset.col)")
    assert cols == ["tenant", "nodes_in", "nodes_out", "asked", "asked_share", "merged", "flagged", "shown"]
    title = browser.execute_script("return document.getElementById('plot-similarity').layout.title.text")
    assert title.startswith("Similarity of the planned pairs (")
    assert browser.execute_script("return document.getElementById('fig-merged_nodes').dataset.value") == \
        str(len(data["nodes"]))


def test_review_command_from_files(run, browser, tmp_path):
    page = tmp_path / "files.html"
    assert main(["review", str(run["src"]), str(run["out"]), "--report", str(run["report_path"]), "--out",
                 str(page)]) == 0
    data = _data(page)
    assert data["summary"]["nodes_in"] == run["report"]["nodes_in"]
    assert data["summary"]["nodes_out"] == run["report"]["nodes_out"]
    assert data["sample"]["of"] == _data(run["page"])["sample"]["of"]
    _open(browser, page)


def test_page_gives_rows_and_bytes_in_the_same_encoding(run, tmp_path):
    """The run's page gives the report's sizes (in the run's encoding); a page made from the two
    files alone gives both stores in the output file's encoding. One vector row a node out."""
    from memforest_gpu.store.size import store_size

    before, after = load_columns(str(run["src"]), vectors=True), load_columns(str(run["out"]), vectors=True)
    page = tmp_path / "files.html"
    assert main(["review", str(run["src"]), str(run["out"]), "--out", str(page)]) == 0
    rep = run["report"]
    files = {"size_in": store_size(before, after.vector_codes).to_dict(), "size_out": store_size(after).to_dict()}
    for data, want in ((_data(run["page"]), rep), (_data(page), files)):
        s = data["summary"]
        assert s["size_in"] == want["size_in"] and s["size_out"] == want["size_out"]
        assert s["size_out"]["rows"] == s["nodes_out"] < s["size_in"]["rows"] == s["nodes_in"]
        assert s["size_in"]["encoding"] == s["size_out"]["encoding"]
        assert s["size_out"]["bytes"] < s["size_in"]["bytes"]


def test_compact_and_graph_pages(tmp_path, browser):
    need("plotly")
    store = _write_store(tmp_path / "s.jsonl", n=120)
    dry, done = tmp_path / "dry.html", tmp_path / "done.html"
    assert main(["compact", str(store), "--max-nodes-per-tenant", "20", "--embedder", "none", "--quiet", "--dry-run",
                 "--review", str(dry)]) == 0
    assert main(["compact", str(store), "--max-nodes-per-tenant", "20", "--embedder", "none", "--quiet",
                 "--review", str(done)]) == 0
    d, p = _data(dry), _data(done)
    assert d["summary"]["planned"] and d["nodes"] and not p["summary"]["planned"] and p["nodes"]
    assert p["summary"]["nodes_out"] == len(load_columns(str(store)))
    for page in (dry, done):
        _open(browser, page)
    from test_graph import synthetic_graph_records
    g = tmp_path / "g.jsonl"
    g.write_text("".join(json.dumps(r) + "\n" for r in synthetic_graph_records()))
    gp = tmp_path / "graph.html"
    assert main(["graph", "compress", str(g), str(tmp_path / "g2.jsonl"), "--embedder", "none", "--quiet",
                 "--review", str(gp)]) == 0
    assert _data(gp)["nodes"] and _data(gp)["summary"]["ratio_asked"] == 0.5
    _open(browser, gp)


def test_page_is_self_contained(run):
    html = run["page"].read_text(encoding="utf-8")
    assert "Plotly" in html and "Content-Security-Policy" in html
    assert not any(s in html.lower() for s in ('<script src', '<link ', 'src="http', "src='http"))
    assert np.isfinite(run["page"].stat().st_size)


def test_condensed_text_is_struck_through_and_flags_are_set(run, browser, tmp_path):
    """A node cap that forces condensing: the sentences a merge dropped are marked in its
    sources and the node is flagged; sources of two speakers flag mixed metadata; a
    --memory-budget run (no merge log) gets its page from the two files."""
    page, rep = tmp_path / "cap.html", tmp_path / "cap.json"
    assert main(["compress", str(run["src"]), str(tmp_path / "o.jsonl"), "--embedder", "none", "--quiet",
                 "--max-node-tokens", "16", "--report", str(rep), "--review", str(page)]) == 0
    d = _data(page)
    assert json.loads(rep.read_text())["condensed"] > 0
    cond = [n for n in d["nodes"] if "condensed" in n["flags"]]
    assert cond and all(any(m["drop"] for m in n["members"]) for n in cond)
    for n in d["nodes"]:
        speakers = {json.loads(m["meta"])["speaker"] for m in n["members"]}
        assert ("mixed_metadata" in n["flags"]) == (len(speakers) > 1) and (n["mixed"] == ["speaker"]) == (
            len(speakers) > 1)
    _open(browser, page)
    assert browser.execute_script("return document.querySelectorAll('#nodes mark.drop').length") > 0 or \
        browser.execute_script("document.getElementById('filter-flag').value = 'condensed';"
                               "document.getElementById('filter-flag').dispatchEvent(new Event('change'));"
                               "return document.querySelectorAll('#nodes mark.drop').length") > 0
    mb = tmp_path / "mb.html"
    assert main(["compress", str(run["src"]), str(tmp_path / "o2.jsonl"), "--embedder", "none", "--quiet",
                 "--memory-budget", "20K", "--review", str(mb)]) == 0
    m = _data(mb)
    assert m["sample"]["of"] > 0 and "weakest link" in m["summary"]["similarity_from"]
    _open(browser, mb)


# ---------------------------------------------------------------------------------------- files that do not match


def _compress(src, out, *extra):
    assert main(["compress", str(src), str(out), "--ratio", "0.5", "--embedder", "none", "--quiet", *extra]) == 0
    return out


def _unrelated(run, d):
    """Another store of the same generator (the same ids, other texts), compressed."""
    return run["src"], _compress(_write_store(d / "other.jsonl", seed=3), d / "other-out.jsonl"), []


def _smaller(run, d):
    return run["src"], _compress(_write_store(d / "small.jsonl", n=200, seed=3), d / "small-out.jsonl"), []


def _compacted(run, d):
    """A compaction that folded in an inbox: INPUT, the store before it, lacks the inbox's memories."""
    import shutil
    store = _write_store(d / "store.jsonl", n=120)
    shutil.copy(store, d / "before.jsonl")
    news = [json.loads(line) for line in open(_write_store(d / "news.jsonl", n=30, seed=5))]
    with open(str(store) + ".inbox.jsonl", "w") as f:
        for j, r in enumerate(news):
            f.write(json.dumps({"id": f"new-{j}", "text": r["text"], "timestamp": r["timestamp"], "tenant": "ann",
                                "embedding": r["embedding"]}) + "\n")
    assert main(["compact", str(store), "--max-nodes-per-tenant", "20", "--embedder", "none", "--quiet"]) == 0
    return d / "before.jsonl", store, []


def _other_report(run, d):
    rep = d / "small.json"
    _compress(_write_store(d / "small.jsonl", n=200, seed=3), d / "small-out.jsonl", "--report", str(rep))
    return run["src"], run["out"], ["--report", str(rep)]


def _other_ratio_report(run, d):
    rep = d / "r03.json"
    assert main(["compress", str(run["src"]), str(d / "r03.jsonl"), "--ratio", "0.3", "--embedder", "none",
                 "--quiet", "--report", str(rep)]) == 0
    return run["src"], run["out"], ["--report", str(rep)]


@pytest.mark.parametrize("case, says", [
    (_unrelated, "nodes that merged nothing hold another text than INPUT's node of the same sources (node "),
    (_smaller, "of INPUT's 240 sources are in no node of OUTPUT (INPUT node "),
    (_compacted, "nodes name sources INPUT does not hold (node "),
    (_other_report, "does not match the files: its nodes_in is 200, INPUT "),
    (_other_ratio_report, "does not match the files: its nodes_out is 168, OUTPUT "),
], ids=["unrelated", "smaller", "compacted", "report-of-another-store", "report-of-another-run"])
def test_review_refuses_files_that_do_not_belong_together(run, tmp_path, capsys, case, says):
    """An OUTPUT not compressed from INPUT, or a --report of another run: one line, status 2, no page."""
    src, out, extra = case(run, tmp_path)
    capsys.readouterr()
    page = tmp_path / "p.html"
    assert main(["review", str(src), str(out), "--out", str(page), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memforest review: error: ") and says in err[0], err
    named = f"OUTPUT {str(out)!r} was not compressed from INPUT {str(src)!r}: " if not extra else \
        f"--report {extra[1]!r} does not match the files: "
    assert named in err[0], err
    assert not page.exists()


# ---------------------------------------------------------------------------------------- what the page says


def _novec(run, d):
    with open(d / "novec.jsonl", "w") as f:
        for line in open(run["src"]):
            r = json.loads(line)
            r.pop("embedding")
            f.write(json.dumps(r) + "\n")
    return d / "novec.jsonl"


def test_a_store_without_vectors_says_similarities_are_unknown(run, browser, tmp_path):
    page = tmp_path / "novec.html"
    assert main(["review", str(_novec(run, tmp_path)), str(run["out"]), "--out", str(page)]) == 0
    s = _data(page)["summary"]
    assert s["flagged"]["low_similarity"] is None and s["similarity_known"] == 0 and s["merged_nodes"] > 0
    _open(browser, page)
    card = browser.execute_script("const c = document.getElementById('fig-flag_low_similarity');"
                                  "return [c.querySelector('.v').textContent, c.querySelector('.k').textContent]")
    assert card == ["unknown", "low similarity (< 0.3): similarities unknown (the input store holds no vectors)"]
    plot = browser.execute_script("const p = document.getElementById('plot-similarity');"
                                  "return [p.querySelectorAll('.main-svg').length, p.textContent]")
    assert plot[0] == 0 and "Similarity of the merged nodes: unknown" in plot[1] and "not a clean bill" in plot[1]


HOSTILE = ['<b>bold</b>', '<span style="font-size:90px;color:red">HUGE</span>',
           '<a href="https://example.com/x">click me</a>']


def test_tenant_names_are_text_in_the_plots(run, browser, tmp_path):
    """Tenant names that are markup show as written on the plots' axes: no live link, no bold, no huge span."""
    store = tmp_path / "hostile.jsonl"
    with open(store, "w") as f:
        for line in open(run["src"]):
            r = json.loads(line)
            f.write(json.dumps(dict(r, tenant=HOSTILE[["ann", "ben", "cyd"].index(r["tenant"])])) + "\n")
    page = tmp_path / "hostile.html"
    _compress(store, tmp_path / "hostile-out.jsonl", "--review", str(page))
    _open(browser, page)
    assert browser.execute_script("return document.querySelectorAll('#plots-section a').length") == 0
    ticks = browser.execute_script(
        "return [...document.querySelectorAll('#plot-tenants .xtick text')].map(e => e.textContent)")
    assert sorted(ticks) == sorted(HOSTILE)
    styled = browser.execute_script("return [...document.querySelectorAll('#plots-section tspan')]"
                                    ".filter(e => /90px|bold/.test(e.getAttribute('style') || '')).length")
    assert styled == 0
    from browser import page_errors
    assert page_errors(browser) == []


def test_tenant_filter_is_searchable_and_says_why_a_tenant_has_none_listed(run, browser, tmp_path):
    page = tmp_path / "sample.html"
    assert main(["review", str(run["src"]), str(run["out"]), "--out", str(page), "--full-tenants", "1",
                 "--per-tenant", "0", "--max-flagged", "0"]) == 0
    d = _data(page)
    t = d["tenants"]
    merged = {n: m for n, m in zip(t["tenant"], t["merged"]) if m}
    shown = dict(zip(t["tenant"], t["shown"]))
    none = sorted(n for n in merged if not shown[n])
    assert none
    _open(browser, page)
    box = browser.find_element("id", "filter-tenant")
    assert box.tag_name == "input" and box.get_attribute("list") == "tenant-names"
    box.click()
    options = browser.execute_script(
        "return [...document.querySelectorAll('#tenant-names option')].map(o => [o.value, o.label])")
    assert options == [[n, f"{merged[n]} merged nodes, {shown[n]} listed"] for n in sorted(merged)]
    box.send_keys(none[0][:2])  # part of a name: the nodes of every tenant whose name holds it
    assert {tn for tn, _ in _visible_nodes(browser)} <= {n for n in merged if none[0][:2] in n}
    box.clear()
    box.send_keys(none[0])
    assert _visible_nodes(browser) == []
    assert browser.find_element("id", "node-count").text == (
        f"0 match; showing 0: none of the {merged[none[0]]} merged nodes of tenant \u201c{none[0]}\u201d is listed on "
        "this page, a bounded sample (the note above); memforest review with a larger --per-tenant or --max-nodes "
        "lists more")


def test_every_flagged_merge_is_listed_first_and_the_rule_says_how_many():
    """Many tenants, more merges than the page lists: every flagged node is listed, and the
    sample's note counts the flagged ones and the tenants with none listed."""
    st = synthetic_store(20000, tenants=2000, dim=8, seed=1, big_tenant_share=0.3)
    from memforest_gpu import CompressConfig, MergeConfig, compress
    res = compress(st, CompressConfig(merge=MergeConfig(ratio=0.5)))
    g = groups_from_merges(st, res.merges)
    flags = {"low_similarity", "long_span", "mixed_metadata"}
    every = review_data(st, g, command="compress", limits=Limits(max_nodes=10 ** 6, low_similarity=0.5,
                                                                  long_span_days=10))
    want = {n["id"] for n in every["nodes"] if flags & set(n["flags"])}
    data = review_data(st, g, command="compress", report=res.report.to_dict(),
                       limits=Limits(max_nodes=1500, low_similarity=0.5, long_span_days=10))
    flagged = data["summary"]["flagged"]
    n_flagged = len(want)
    assert 0 < n_flagged == flagged["low_similarity"] + flagged["long_span"] - sum(
        1 for n in every["nodes"] if {"low_similarity", "long_span"} <= set(n["flags"]))
    assert len(data["nodes"]) == 1500 < len(g)
    assert want <= {n["id"] for n in data["nodes"]}
    assert data["sample"]["flagged"] == {"listed": n_flagged, "of": n_flagged}
    rule = data["sample"]["rule"]
    assert rule.startswith("every flagged merged node first, most suspect first, up to 5,000; ")
    t = data["sample"]["tenants"]
    assert f"Here {n_flagged:,} of the {n_flagged:,} flagged merged nodes are listed" in rule
    assert t["with_merges"] == len(set(g.tenant)) and f"{t['with_merges'] - t['listed']:,} none" in rule


def test_ratio_asked_is_the_flag_and_the_rounding_is_apart(run, browser, tmp_path):
    """--ratio 0.5 is shown as 50.0 %; the removals asked over the nodes (each tenant's count
    rounded) is a figure of its own; the report keeps the flag for memforest review."""
    src = _write_store(tmp_path / "odd.jsonl", n=241)
    out, rep, page = tmp_path / "odd-out.jsonl", tmp_path / "odd.json", tmp_path / "odd.html"
    _compress(src, out, "--report", str(rep), "--review", str(page))
    assert json.loads(rep.read_text())["ratio_asked"] == 0.5
    page2 = tmp_path / "odd2.html"
    assert main(["review", str(src), str(out), "--report", str(rep), "--out", str(page2)]) == 0
    for p in (page, page2):
        s = _data(p)["summary"]
        assert s["ratio_asked"] == 0.5 and s["asked_share"] == s["asked"] / s["nodes_in"] != 0.5
    _open(browser, page2)
    cards = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#summary .card')]"
        ".map(e => [e.id.slice(4), [e.querySelector('.v').textContent, e.querySelector('.k').textContent]]))")
    assert cards["ratio_asked"] == ["50.0 %", "ratio asked (--ratio)"]
    assert cards["asked_share"][0] == f"{100 * s['asked'] / s['nodes_in']:.1f} %"
    assert cards["asked_share"][1] == "removals asked / nodes in (each tenant's rounded)"
    assert browser.execute_script("return document.getElementById('plot-similarity').layout.yaxis.type") == "log"
