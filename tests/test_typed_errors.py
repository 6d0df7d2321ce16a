"""Errors as types: the Python API names its parameters, the command line its flags (added in cli/)."""
import json

import pytest

from memforest_gpu import CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.api import compress_file, load_store_and_embedder
from memforest_gpu.cli.commands import main
from memforest_gpu.config import ConfigError
from memforest_gpu.mergers import ExtractiveMerger
from memforest_gpu.mergers.base import unwrap
from memforest_gpu.runs.errors import OptionError
from memforest_gpu.runs.journal import JournaledMerger, JournalExistsError
from memforest_gpu.runs.loading import NoEmbeddingsError


def _no_vectors(path):
    path.write_text("".join(json.dumps({"id": f"n{i}", "text": f"note {i}", "timestamp": i}) + "\n" for i in range(4)))
    return str(path)


def test_config_errors_carry_their_field_and_the_command_line_names_its_flag(capsys):
    with pytest.raises(ConfigError) as e:
        PartitionConfig(alpha=2.0)
    assert isinstance(e.value, ValueError) and e.value.field == "alpha"
    assert str(e.value) == "alpha must be in [0.0, 1.0], got 2.0"
    assert e.value.named("--alpha") == "--alpha must be in [0.0, 1.0], got 2.0"
    with pytest.raises(ConfigError, match="max_node_tokens must be an integer >= 1") as e:
        MergeConfig(max_node_tokens=0)
    assert e.value.field == "max_node_tokens"
    assert main(["compress", "in.jsonl", "out.jsonl", "--max-node-tokens", "0"]) == 2
    assert "error: --max-node-tokens must be an integer >= 1, got 0" in capsys.readouterr().err


def test_a_store_without_vectors_and_no_embedder(tmp_path, capsys):
    src = _no_vectors(tmp_path / "in.jsonl")
    with pytest.raises(NoEmbeddingsError) as e:
        load_store_and_embedder(src, embedder="none")
    assert e.value.path == src and "embedder 'none' cannot be used" in str(e.value) and "--" not in str(e.value)
    assert main(["compress", src, str(tmp_path / "out.jsonl"), "--embedder", "none", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the store has no embeddings, so --embedder none cannot be used; pass --embedder auto" in err


def test_a_left_journal_names_resume_in_each_callers_words(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"n{i}", "text": f"note {i}", "timestamp": i, "embedding": [1.0, i]})
                           + "\n" for i in range(6)))
    out = tmp_path / "out.jsonl"
    (tmp_path / "out.jsonl.journal.jsonl").write_text("")
    cfg = CompressConfig(merge=MergeConfig(ratio=0.5))
    with pytest.raises(JournalExistsError, match="pass resume=True to continue"):
        compress_file(src, out, cfg, embedder="none")
    assert main(["compress", str(src), str(out), "--embedder", "none", "--quiet"]) == 2
    assert "pass --resume to continue that run" in capsys.readouterr().err


def test_option_errors_read_as_parameters_or_flags():
    e = OptionError("{embedder}'s dimension must match; pass {embedder=default} or PATH, or {replace_changed}; "
                    "the id 'a{b}' stays")
    assert str(e) == "embedder's dimension must match; pass embedder=default or PATH, or replace_changed; " \
                     "the id 'a{b}' stays"
    assert e.for_command() == "--embedder's dimension must match; pass --embedder default or PATH, or " \
                              "--replace-changed; the id 'a{b}' stays"


def test_unwrap_follows_a_journal_to_its_merger(tmp_path):
    ex = ExtractiveMerger()
    jm = JournaledMerger(ex, tmp_path / "j.jsonl", fingerprint={"fingerprint": "f", "parts": {}})
    assert unwrap(jm) is ex and unwrap(ex) is ex
