"""No message is read for a name: the mergers' and the evaluation's errors carry their option's
name (``ConfigError.field``, ``OptionError``'s placeholders), the Python API's messages and
warnings name parameters (``resume=True``, ``memory_budget``), and only the command line
writes flags. (Each test imports what it reads, so that on a tree without these types each
fails on its own assertion.)"""
import logging

import numpy as np
import pytest

from memforest_gpu.cli.commands import main
from memforest_gpu.cli.running import error_message, option_error
from memforest_gpu.config import ConfigError
from memforest_gpu.evaluation.benchmark import load_benchmark
from memforest_gpu.mergers import get_merger
from memforest_gpu.runs.budget_groups import TenantScan, node_bytes
from memforest_gpu.runs.budgeted import _pack
from memforest_gpu.runs.errors import OptionError


def test_merger_and_evaluation_errors_carry_their_option():
    with pytest.raises(ConfigError) as e:
        get_merger("openai", model="m", base_url="http://127.0.0.1:1/v1", max_retries=-1)
    assert e.value.field == "max_retries" and str(e.value).startswith("max_retries must be an integer >= 0")
    assert option_error(e.value, ["merger", "max_retries"]).startswith("--max-retries must be an integer >= 0")
    with pytest.raises(ConfigError) as e:
        get_merger("extractive", near_duplicate=2)
    assert e.value.field == "near_duplicate"
    # a message is never read for a name: a plain ValueError keeps its words
    assert option_error(ValueError("max_tokens must be x"), ["max_tokens"]) == "max_tokens must be x"
    assert option_error(ValueError("contexts must have one entry per question"), ["contexts"]) == \
        "contexts must have one entry per question"

    from memforest_gpu.mergers import MissingOptionError

    with pytest.raises(MissingOptionError) as e:
        get_merger("openai")
    assert e.value.missing == ["model"] and "(e.g. model=...)" in str(e.value) and "--" not in str(e.value)
    assert "(e.g. --model ...)" in error_message(e.value)


def test_evaluation_option_errors_name_parameters_in_python_and_flags_on_the_command_line(tmp_path):
    with pytest.raises(OptionError) as e:
        load_benchmark(str(tmp_path), skip_missing_contexts=True)
    assert str(e.value).startswith("skip_missing_contexts is for PersonaMem's questions .csv")
    assert "--" not in str(e.value)
    assert error_message(e.value).startswith("--skip-missing-contexts is for PersonaMem's questions .csv")
    with pytest.raises(OptionError) as e:
        load_benchmark(str(tmp_path), nodes="facts")
    assert str(e.value).startswith("nodes, turns_per_node and contexts need a published benchmark file")
    assert error_message(e.value).startswith("--nodes, --turns-per-node and --contexts need")


def test_run_errors_name_resume_true_and_the_command_its_flag():
    from memforest_gpu.cli.running import interrupted_message
    from memforest_gpu.runs.journal import JournalWriteError
    from memforest_gpu.runs.loading import RunInterrupted

    stop = RunInterrupted("interrupted; 3 merges are journaled in 'o.journal.jsonl'", resumable=True)
    assert "resume=True" in str(stop) and "--" not in str(stop)
    assert interrupted_message(stop) == ("interrupted; 3 merges are journaled in 'o.journal.jsonl': rerun the same "
                                         "command with --resume to continue from them")
    assert interrupted_message(RunInterrupted("interrupted; nothing was written")) == "interrupted; nothing was written"
    full = JournalWriteError("o.journal.jsonl", "No space left on device")
    assert str(full).endswith("rerun with resume=True)") and "--" not in str(full)
    assert error_message(full).endswith("rerun with --resume)")


def test_a_warning_names_the_parameter_in_python_and_the_flag_in_a_command(caplog):
    from memforest_gpu.runs.errors import OPTION_WORDS

    scan = TenantScan(["big", "small"], np.array([400, 10]), np.zeros(410, dtype=np.int64), 8)
    budget = 2 * 100 * node_bytes(8)  # a group capacity of 100 nodes: "big" is over it
    with caplog.at_level(logging.WARNING, logger="memforest_gpu"):
        _pack(scan, budget, print)
        with OPTION_WORDS.as_command():
            _pack(scan, budget, print)
    api, cli = [r.getMessage() for r in caplog.records if "over the group capacity" in r.getMessage()]
    assert "group capacity of memory_budget" in api and "--" not in api
    assert "group capacity of --memory-budget" in cli
    assert not OPTION_WORDS.command  # the API's words again once the command is done


def test_the_command_line_names_the_flag_of_a_merger_option(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "x", "timestamp": 1}\n')
    assert main(["compress", str(src), str(tmp_path / "o.jsonl"), "--merger", "openai", "--model", "m",
                 "--max-tokens", "0", "--embedder", "none"]) == 2
    assert "--max-tokens must be an integer >= 1" in capsys.readouterr().err
