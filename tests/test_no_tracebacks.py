"""The traceback sweep: the command line over a table of bad inputs (one row each), in
process. Every row must end with its exit status (2 for bad input, non-zero for a
run that failed), exactly one line on stderr naming what is wrong (the flag, the file, the
line or the field), no traceback and no uncaught exception, and no file written (the files
a row's setup made are all that is there afterwards, unless the row says otherwise)."""
from __future__ import annotations

import json
import os
import socket
import traceback

import pytest
from compact_helpers import arrivals, store_of
from published_fixtures import CONTEXT_A, longmemeval_items, personamem_contexts, write_personamem

from memforest_gpu.cli.commands import main
from memforest_gpu.store.io import write_store

GRID = ["--methods", "tome", "--ratios", "0.5", "--seeds", "0", "--quiet", "--bootstrap", "10"]
NONE = ["--embedder", "none", "--quiet"]


def _write(tmp, name: str, text: str | bytes) -> str:
    p = tmp / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(p)


def _store(tmp, name="store.jsonl") -> str:
    path = str(tmp / name)
    write_store(store_of(arrivals(0, 30, ["a", "b"])), path)
    return path


def _inbox(*records, text: str | None = None, extra=(), budget="100"):
    """``compact`` on a store of tenants a and b whose inbox holds ``records`` (or ``text``)."""
    def setup(tmp):
        path = _store(tmp)
        body = text if text is not None else "".join(json.dumps(r) + "\n" for r in records)
        _write(tmp, "store.jsonl.inbox.jsonl", body)
        return ["compact", path, "--max-nodes-per-tenant", budget, "--preset", "paper", *NONE, *extra]
    return setup


def _new(i: int, **kw) -> dict:
    r = arrivals(9, i + 1, ["a"])[i]
    r.update(kw)
    return r


def _merged_id_in_inbox(tmp):
    """A store compacted once (so it has merged nodes), and an inbox record reusing a merged node's id."""
    path = _store(tmp)
    assert main(["compact", path, "--max-nodes-per-tenant", "20", "--preset", "paper", *NONE]) == 0
    with open(path) as f:
        merged = next(r for r in map(json.loads, f) if len(r.get("sources") or []) > 1)
    _write(tmp, "store.jsonl.inbox.jsonl", json.dumps(_new(0, id=merged["id"], tenant=merged["tenant"])) + "\n")
    return ["compact", path, "--max-nodes-per-tenant", "100", "--preset", "paper", "--replace-changed", *NONE]


def _journal(text: str):
    def setup(tmp):
        path = _store(tmp)
        _write(tmp, "store.jsonl.journal.jsonl", text)
        return ["compact", path, "--max-nodes-per-tenant", "20", "--preset", "paper", *NONE]
    return setup


def _dead_url() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # closed again: nothing listens there


def _mem0(text: str, name="bad.yaml", sub="compress"):
    def setup(tmp):
        path = _write(tmp, name, text)
        extra = ["--max-per-user", "5"] if sub == "compact" else ["--user-id", "alice", "--dry-run"]
        return ["mem0", sub, "--config", path, *extra]
    return setup


def _lme(edit=None, name="longmemeval_s.json", *extra, data=None):
    def setup(tmp):
        items = longmemeval_items()
        if edit is not None:
            edit(items)
        path = _write(tmp, name, json.dumps(items if data is None else data))
        return ["eval", "--benchmark", path, "--out", str(tmp / "out"), *GRID, *extra]
    return setup


def _pm(edit=None, *extra, contexts_text=None):
    def setup(tmp):
        (tmp / "pm").mkdir()
        q, c = write_personamem(tmp / "pm")
        if edit is not None or contexts_text is not None:
            ctx = personamem_contexts()
            if edit is not None:
                edit(ctx)
            text = contexts_text if contexts_text is not None else \
                "".join(json.dumps({k: v}) + "\n" for k, v in ctx.items())
            _write(tmp / "pm", os.path.basename(c), text)
        return ["eval", "--benchmark", q, "--out", str(tmp / "out"), *GRID, *extra]
    return setup


def _set(path: list, value):
    def edit(obj):
        for k in path[:-1]:
            obj = obj[k]
        if value is _DEL:
            del obj[path[-1]]
        else:
            obj[path[-1]] = value
    return edit


_DEL = object()


def _m3(edit):
    """``graph compress`` of a small M3-Agent pickle (two clips of text nodes, a face) after ``edit(graph)``."""
    def setup(tmp):
        from memforest_gpu.adapters.m3agent import VideoGraph, save_video_graph
        g = VideoGraph()
        for nid in range(6):
            node = VideoGraph.Node(nid, "episodic" if nid % 2 == 0 else "semantic")
            node.embeddings = [[float(nid % 3 == j) + 0.1 for j in range(4)]]
            node.metadata = {"contents": [f"clip {nid // 3} event {nid}"], "timestamp": nid // 3}
            g.nodes[nid] = node
            g.text_nodes.append(nid)
            g.text_nodes_by_clip.setdefault(nid // 3, []).append(nid)
            if node.type == "episodic":
                g.event_sequence_by_clip.setdefault(nid // 3, []).append(nid)
        face = VideoGraph.Node(6, "img")
        face.embeddings, face.metadata = [[0.5] * 4], {"contents": ["face"]}
        g.nodes[6], g.edges[(0, 6)], g.edges[(6, 0)], g.next_node_id = face, 1.0, 1.0, 7
        edit(g)
        path = str(tmp / "video.pkl")
        save_video_graph(g, path)
        return ["graph", "compress", path, str(tmp / "out.pkl"), "--embedder", "none", "--quiet"]
    return setup


def _lines(name: str, edit):
    """A JSON Lines store whose lines (header and records) ``edit`` rewrites (a list of strings, in place)."""
    def setup(tmp):
        path = _store(tmp, name)
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        edit(lines)
        _write(tmp, name, "\n".join(lines) + "\n")
        return path
    return setup


def _parquet_tree(tmp):
    """A Parquet store written by compress, whose row 3 says it is in tree -3."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = str(tmp / "c.parquet")
    assert main(["compress", _store(tmp), path, *NONE]) == 0
    t = pq.read_table(path)
    tree = t.column("tree").to_pylist()
    tree[3] = -3
    pq.write_table(t.set_column(t.schema.get_field_index("tree"), "tree", pa.array(tree, pa.int64())), path)
    return ["compact", path, "--max-nodes-per-tenant", "10", *NONE]


def _tree_line(lines):
    lines[4] = lines[4][:-1] + ', "tree": -3}'


def _surrogate(lines):
    lines[2] = lines[2].replace('"text": "', '"text": "\\ud800', 1)


# (id, setup(tmp) -> argv, exit status, what the one line must hold[, the folder a failed run may leave])
CASES = [
    # 2: a Mem0 config that is not YAML, or YAML that builds Python objects
    ("2 yaml unclosed brace", _mem0("vector_store:\n  provider: qdrant\n  config: {collection_name: m, path: ./q\n"
                                    " bad: [\n"), 2, "bad.yaml must be a Mem0 config in YAML, got expected ',' or '}'"),
    ("2 yaml tab", _mem0("vector_store:\n\tprovider: qdrant\n"), 2, "found character '\\t' that cannot start any "
                                                                     "token at line 2 column 1"),
    ("2 yaml a: b: c", _mem0("a: b: c\n"), 2, "mapping values are not allowed here at line 1 column 5"),
    ("2 yaml two documents", _mem0("vector_store: {}\n---\nb: 1\n"), 2,
     "expected a single document in the stream but found another document at line 2"),
    ("2 yaml python tag", _mem0("vector_store: !!python/object/apply:os.system ['echo hi']\n"), 2,
     "(tags that build Python objects are refused)"),
    ("2 yaml compact", _mem0("a: b: c\n", sub="compact"), 2, "must be a Mem0 config in YAML"),
    ("2 yaml restore", lambda tmp: ["mem0", "restore", str(tmp / "backup.parquet"), "--config",
                                    _write(tmp, "bad.yaml", "a: b: c\n")], 2, "must be a Mem0 config in YAML"),
    # 3, 4: sections of the wrong shape
    ("3 vector_store a string", _mem0("vector_store: qdrant\n"), 2,
     "bad.yaml: vector_store must be a mapping with provider and config, got a string 'qdrant'"),
    ("3 config a list", _mem0("vector_store:\n  provider: qdrant\n  config: [1]\n"), 2,
     "vector_store.config must be a mapping, got a list [1]"),
    ("4 chroma port abc", _mem0(json.dumps({"vector_store": {"provider": "chroma", "config": {
        "collection_name": "m", "host": "127.0.0.1", "port": "abc"}}}), name="c.json"), 2,
     "c.json: vector_store.config.port must be an integer port in [1, 65535], got a string 'abc'"),
    # 12: Mem0 JSON, encoding and folder errors name the file
    ("12 mem0 bad json", _mem0('{"vector_store": ', name="c.json"), 2,
     "c.json must be a Mem0 config in JSON, got bad JSON at line 1 column 18"),
    ("12 mem0 not utf-8", _mem0(b"\xff\xfevector_store: {}\n"), 2, "bad.yaml must be UTF-8 text"),
    ("12 mem0 folder", lambda tmp: (tmp / "cfg.yaml").mkdir() or ["mem0", "compress", "--config",
                                                                   str(tmp / "cfg.yaml"), "--user-id", "a"], 2,
     "--config must be a Mem0 config file (YAML or JSON), got the folder"),
    # 5, 9: PersonaMem messages that are not {role, content} objects
    ("5 personamem message a string", _pm(lambda c: c[CONTEXT_A].__setitem__(1, "hello")), 2,
     f"shared_contexts_32k.jsonl, line 1: context {CONTEXT_A[:12]!r}: message 1 must be an object {{role, content}}, "
     "got a string 'hello'"),
    ("9 personamem message without role", _pm(lambda c: c[CONTEXT_A][1].pop("role")), 2,
     "message 1: role must be one of ['system', 'user', 'assistant'], got none"),
    ("9 personamem content a number", _pm(lambda c: c[CONTEXT_A][2].update(content=5)), 2,
     "message 2: content must be a string, got a number 5"),
    ("9 longmemeval answer null", _lme(_set([0, "answer"], None)), 2,
     "longmemeval_s.json: item 0 ('lme_q01'): answer must be a string or a number, got null"),
    ("9 longmemeval role null", _lme(_set([0, "haystack_sessions", 0, 0, "role"], None)), 2,
     "item 0 ('lme_q01'): turn 0 of session 0: role must be a string, got null"),
    # 12: LongMemEval errors name the file and the item; its top level is never called a LoCoMo sample
    ("12 longmemeval question_date", _lme(_set([1, "question_date"], "yesterday")), 2,
     "longmemeval_s.json: item 1 ('lme_q02'): question_date must look like '2023/05/20 (Sat) 02:21', got "
     "'yesterday'"),
    ("12 longmemeval top level an object", _lme(data={"data": longmemeval_items()}), 2,
     "longmemeval_s.json must hold a non-empty list of LongMemEval items (objects with question_id, question, "
     "answer and haystack_sessions), got an object with keys ['data']"),
    ("12 longmemeval empty list", _lme(data=[]), 2,
     "longmemeval_s.json must hold a non-empty list of LongMemEval items"),
    ("12 longmemeval bad json", lambda tmp: ["eval", "--benchmark", _write(tmp, "longmemeval_s.json", "[{\n  x"),
                                             "--out", str(tmp / "out")], 2,
     "longmemeval_s.json must be LongMemEval JSON, got bad JSON at line 2 column 3"),
    # 10: a search for nothing, --keys below 0, a --text-weight nothing reads
    ("10 search empty query", lambda tmp: ["search", _store(tmp), "  "], 2,
     "memforest search: error: QUERY must be a text to search for, got '  '"),
    ("10 --keys -1", lambda tmp: ["compress", _store(tmp), str(tmp / "out.jsonl"), "--keys", "-1", *NONE], 2,
     "argument --keys: must be an integer >= 0 or 'all', got '-1'"),
    ("10 --keys 0 --text-weight 0.3", lambda tmp: ["compress", _store(tmp), str(tmp / "out.jsonl"), "--keys", "0",
                                                   "--text-weight", "0.3", *NONE], 2,
     "--text-weight applies to merged nodes that keep keys (--keys K or all), got --keys 0"),
    ("10 paper preset --text-weight", lambda tmp: ["compact", _store(tmp), "--max-nodes-per-tenant", "5", "--preset",
                                                   "paper", "--text-weight", "0.3", *NONE], 2,
     "got the paper preset's keys 0"),
    # 11: messages name the flag the user typed
    ("11 --llm-option foo", _lme(None, "longmemeval_s.json", "--answer-model", "m", "--llm-option", "foo"), 2,
     "--llm-option must be KEY=VALUE, got 'foo'"),
    ("11 --llm-option unknown", _lme(None, "longmemeval_s.json", "--answer-model", "m", "--llm-option", "colour=red"),
     2, "--llm-option: options of the back end 'openai' must be among"),
    ("11 vllm: without a path", _lme(None, "longmemeval_s.json", "--answer-model", "vllm:"), 2,
     "--answer-model must be vllm:PATH (a model directory or .gguf file), got 'vllm:'"),
    ("11 -k 0", _lme(None, "longmemeval_s.json", "-k", "0"), 2, "memforest eval: error: -k must be an integer >= 1"),
    ("11 --answer-max-tokens -5", _lme(None, "longmemeval_s.json", "--answer-model", "m", "--answer-max-tokens", "-5"),
     2, "--answer-max-tokens must be an integer >= 1, got -5"),
    ("11 --max-questions 0", _lme(None, "longmemeval_s.json", "--max-questions", "0"), 2,
     "--max-questions must be an integer >= 1, got 0"),
    ("11 --keys abc is one line", lambda tmp: ["compress", "a.jsonl", "b.jsonl", "--keys", "abc"], 2,
     "memforest compress: error: argument --keys: must be an integer >= 0 or 'all', got 'abc'"),
    ("11 search -k 0", lambda tmp: ["search", _store(tmp), "x", "-k", "0"], 2, "-k must be an integer >= 1, got 0"),
    # 12: a model path, --cache
    ("12 transformers model not there", _lme(None, "longmemeval_s.json", "--answer-model",
                                             "transformers:/nonexistent/model.gguf"), 2,
     "--answer-model must be transformers:PATH, a local model directory or .gguf file, got "
     "'transformers:/nonexistent/model.gguf' (no such file or folder)"),
    ("12 --cache through a file", lambda tmp: _lme()(tmp) + ["--cache", _write(tmp, "f", "x") + "/sub"], 2,
     "--cache must be a path through folders, got"),
    ("12 --cache in a folder that takes none", _lme(None, "longmemeval_s.json", "--cache", "/proc/self/cache"), 2,
     "--cache must be a folder memforest can create, cannot create folders in '/proc/self'"),
    # 6: a run whose every answer request failed (nothing listens at --base-url); its embedding cache is kept
    ("6 every answer failed", lambda tmp: _lme(None, "longmemeval_s.json", "--answer-model", "foo:bar", "--base-url",
                                               _dead_url(), "--llm-option", "max_retries=0")(tmp), 1,
     "every answer request failed (", "out/"),
    # 7: inbox records: a tenant that is not a string, fields the compaction makes
    ("7 inbox tenant a number", _inbox(_new(0, tenant=123)), 2,
     "store.jsonl.inbox.jsonl, line 1: tenant of record 'a-s9-0' must be a non-empty string, got a number 123"),
    ("7 inbox record with keys", _inbox(_new(0), _new(1, keys=[[0.1] * 16])), 2,
     "store.jsonl.inbox.jsonl, line 2: record 'a-s9-1' must not carry 'keys' (a new memory's key vectors are made by "
     "the compaction)"),
    ("7 inbox record with a tree", _inbox(_new(0, tree=3)), 2, "record 'a-s9-0' must not carry 'tree'"),
    ("7 inbox record with another field", _inbox(_new(0, colour="red")), 2,
     "got 'colour' (put anything else under metadata)"),
    # 8: an M3-Agent pickle is never written under a store's suffix
    ("8 graph pickle into out.jsonl", lambda tmp: ["graph", "compress", _write(tmp, "video.pkl", b"not read"),
                                                   str(tmp / "out.jsonl")], 2,
     "OUTPUT must be an M3-Agent pickle (.pkl or .pickle), as an M3-Agent graph is written back as one, got"),
    # 13: inbox embeddings get their line number
    ("13 inbox mixed dimensions", _inbox(_new(0), _new(1, embedding=[0.5] * 8)), 2,
     "store.jsonl.inbox.jsonl, line 2: embedding of record 'a-s9-1' must have 16 values like the record on line 1, "
     "got 8"),
    ("13 inbox embedding a string", _inbox(_new(0), _new(1, embedding="abc")), 2,
     "store.jsonl.inbox.jsonl, line 2: embedding of record 'a-s9-1' must be a list of finite numbers, got a string "
     "'abc'"),
    ("13 inbox embedding with NaN", _inbox(text='{"id": "n1", "text": "x", "timestamp": 1, "tenant": "a", '
                                             '"embedding": [NaN, 1]}\n'), 2,
     "line 1: embedding of record 'n1' must be a list of finite numbers"),
    # 14: remedies that work
    ("14 inbox id of a merged node", _merged_id_in_inbox, 2,
     "that node is a merged node, which nothing replaces (its originals would be lost): give the record a new id"),
    ("14 garbage journal line", _journal("garbage\n"), 2,
     "store.jsonl.journal.jsonl: line 1 must be a memforest merge journal's header, got b'garbage'; the journal only "
     "saves work: delete it to start over"),
    # 12: the contexts file's JSON errors name the file and the line
    ("12 personamem contexts bad json", _pm(contexts_text="\n\n{bad\n"), 2,
     "shared_contexts_32k.jsonl, line 3 must be one JSON object {context id: [messages]}, got bad JSON"),
    ("published: a missing context names the flag", _pm(contexts_text=json.dumps(
        {CONTEXT_A: personamem_contexts()[CONTEXT_A]}) + "\n"), 2,
     "(1 of 4 questions name one of 1 contexts the file lacks; --skip-missing-contexts evaluates the others"),
    ("published: --skip-missing-contexts on LongMemEval", _lme(None, "longmemeval_s.json", "--skip-missing-contexts"),
     2, "--skip-missing-contexts is for PersonaMem's questions .csv"),
    # bounds: eval's ranked list (L x k rows per question) is refused above a sane size before any work
    ("bounds: eval -k 1001", _lme(None, "longmemeval_s.json", "-k", "1001"), 2,
     "memforest eval: error: -k must be an integer in [1, 1000] (nodes at the @k cut), got 1001"),
    ("bounds: eval --L 2000", _lme(None, "longmemeval_s.json", "--L", "2000"), 2,
     "--L must be at most 1000 with k = 10 (the ranked list holds L x k nodes per question, at most 10000), got 2000"),
    # graph pickles: vectors that are not numbers, references to nodes the graph lacks
    ("graph pickle: a string embedding", _m3(lambda g: setattr(g.nodes[1], "embeddings", ["abc"])), 2,
     "video.pkl: embeddings of text node 1 must be a non-empty list of vectors (lists of finite numbers) of one "
     "dimension, got a string 'abc' as vector 0"),
    ("graph pickle: a string in a vector", _m3(lambda g: g.nodes[2].embeddings[0].__setitem__(1, "x")), 2,
     "video.pkl: embeddings of text node 2 must be a non-empty list of vectors (lists of finite numbers) of one "
     "dimension, got a string 'x' in vector 0"),
    ("graph pickle: text_nodes names a missing node", _m3(lambda g: g.text_nodes.append(99)), 2,
     "video.pkl: text_nodes must name nodes of the graph, got 99, which is not one"),
    ("graph pickle: a clip names a missing node", _m3(lambda g: g.event_sequence_by_clip[1].append(55)), 2,
     "video.pkl: event_sequence_by_clip[1] must name nodes of the graph, got 55, which is not one"),
    ("graph pickle: an edge to a missing node", _m3(lambda g: g.edges.__setitem__((0, 77), 1.0)), 2,
     "video.pkl: edge (0, 77) must join two nodes of the graph, got 77, which is not one"),
    ("graph pickle: an edge weight that is text", _m3(lambda g: g.edges.__setitem__((0, 6), "heavy")), 2,
     "video.pkl: the weight of edge (0, 6) must be a finite number, got a string 'heavy'"),
    # store files: a negative tree, a lone surrogate
    ("store: tree -3 in a JSON Lines store", lambda tmp: ["info", _lines("store.jsonl", _tree_line)(tmp)], 2,
     "store.jsonl: line 5: tree of node 'a-s0-4' must be an integer >= 0 or null (a node not placed yet), got -3"),
    ("store: tree -3 in a Parquet store", _parquet_tree, 2,
     "c.parquet: row 3 (node "),
    ("store: a lone surrogate in a text", lambda tmp: ["compress", _lines("store.jsonl", _surrogate)(tmp),
                                                       str(tmp / "out.jsonl"), *NONE], 2,
     "store.jsonl: line 3: text of node 'a-s0-2' must be Unicode text, got a lone surrogate '\\ud800' (half of a "
     "UTF-16 pair) at character 0"),
    # paths: a folder where the system lets nothing be created
    ("paths: review --out /proc/x.html", lambda tmp: ["review", _store(tmp), _store(tmp, "o.jsonl"), "--out",
                                                      "/proc/x.html"], 2,
     "--out must be in a writable folder, cannot write in '/proc': the system lets nothing be created there"),
    ("paths: demo --out /proc/x", lambda tmp: ["demo", "--out", "/proc/x"], 2,
     "--out must be a folder memforest can create, cannot create folders in '/proc': the system lets nothing be "
     "created there"),
    # a budget that leaves a tenant nothing
    ("compact: --max-nodes-per-tenant 1", lambda tmp: ["compact", _store(tmp), "--max-nodes-per-tenant", "1", *NONE],
     2, "--max-nodes-per-tenant must be at least 2 with --low-water 0.8 (a tenant over budget is compacted to "
        "floor(0.8 x N) memories, which must leave one), got 1"),
    # a query holding bytes that are not UTF-8 (they arrive as lone surrogates)
    ("search: a query that is not UTF-8", lambda tmp: ["search", _store(tmp), "x \udcff", "--tenant", "a"], 2,
     "QUERY must be UTF-8 text, got 'x \\udcff' (a byte that is not UTF-8 at character 2)"),
    # a context budget smaller than a date tag
    ("search: --max-tokens 1", lambda tmp: ["search", _store(tmp), "x", "--tenant", "a", "--max-tokens", "1"], 2,
     "--max-tokens must be an integer >= 4 (whitespace tokens; a piece's date tag takes 3), got 1"),
]


def _files(tmp) -> set:
    return {os.path.relpath(os.path.join(d, f), tmp) for d, _, fs in os.walk(tmp) for f in fs} | \
        {os.path.relpath(os.path.join(d, x), tmp) + "/" for d, xs, _ in os.walk(tmp) for x in xs}


ROWS = [(*c, None) if len(c) == 4 else c for c in CASES]


@pytest.mark.parametrize("case, setup, status, message, may_write", ROWS, ids=[c[0] for c in ROWS])
def test_bad_input_is_one_line_and_no_traceback(tmp_path, capsys, monkeypatch, case, setup, status, message,
                                                may_write):
    monkeypatch.chdir(tmp_path)
    argv = setup(tmp_path)
    before = _files(tmp_path)
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    except BaseException:  # noqa: BLE001 -- the point of the sweep
        pytest.fail(f"uncaught exception for {argv}:\n{traceback.format_exc()}")
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert rc == status, (rc, err)
    assert len(lines) == 1 and message in lines[0], err
    after = {f for f in _files(tmp_path) if may_write is None or not f.startswith(may_write)}
    assert after == before, "nothing may be written"
