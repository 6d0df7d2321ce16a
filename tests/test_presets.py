"""Named presets: "memforest" is CompressConfig() and every command's default, "paper" the method's values;
a flag given on the command line overrides only its own field."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from memforest_gpu.cli.commands import build_parser
from memforest_gpu.cli.flags import config_from_args
from memforest_gpu.config import DEFAULT_PRESET, PRESETS, CompressConfig, preset


def _parse(*flags):
    return config_from_args(build_parser().parse_args(["compress", "a", "b", *flags]))


def test_the_dataclass_defaults_are_the_shipped_preset_and_paper_is_spec():
    assert preset("memforest") == CompressConfig() == CompressConfig.preset("memforest")
    p = CompressConfig.preset("paper")
    assert p.partition.alpha == 0.05 and p.merge.schedule == "sequential" and p != CompressConfig()
    assert (p.spanning.time_weight, p.spanning.size_weight, p.merge.keys, p.merge.vectors) == (0.0, 0.0, 0, "float32")
    assert DEFAULT_PRESET == "memforest" and set(PRESETS) == {"memforest", "paper"}


def test_memforest_preset_values():
    c = CompressConfig.preset("memforest")
    assert (c.partition.alpha, c.spanning.time_weight, c.spanning.size_weight, c.merge.schedule) == (0.001, 0.5, 0.2,
                                                                                           "matching")
    assert (c.spanning.time_rule, c.spanning.time_min_cos) == ("gated", 0.3)  # related neighbours only (issue 22)
    assert (c.merge.keys, c.merge.text_weight) == (1, 0.8)  # one vector per node: 0.8 text + 0.2 sources' centre
    # everything else is the method's
    p = preset("paper")
    assert dataclasses.replace(c, partition=p.partition, spanning=p.spanning, merge=p.merge) == p
    assert c.partition == dataclasses.replace(p.partition, alpha=0.001)


def test_unknown_preset_names_the_choices(capsys):
    with pytest.raises(ValueError, match=r"preset must be one of \['memforest', 'paper'\], got 'fast'"):
        preset("fast")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compress", "a", "b", "--preset", "fast"])
    assert "invalid choice: 'fast' (choose from 'memforest', 'paper')" in capsys.readouterr().err.replace('"', "'")


def test_cli_default_is_the_memforest_preset_and_flags_override_one_field():
    assert _parse() == preset("memforest")
    assert _parse() == CompressConfig()
    assert _parse("--preset", "paper") == preset("paper")
    p = preset("paper")
    assert _parse("--preset", "paper", "--alpha", "0.01") == dataclasses.replace(
        p, partition=dataclasses.replace(p.partition, alpha=0.01))
    m = preset("memforest")
    assert _parse("--schedule", "sequential") == dataclasses.replace(
        m, merge=dataclasses.replace(m.merge, schedule="sequential"))
    assert _parse("--time-weight", "0") == dataclasses.replace(
        m, spanning=dataclasses.replace(m.spanning, time_weight=0.0))
    with pytest.raises(ValueError, match=r"--alpha must be in \[0.0, 1.0\], got 2.0"):
        _parse("--preset", "paper", "--alpha", "2")


def test_every_compress_command_has_the_preset_option_and_help_shows_its_values():
    from memforest_gpu.cli.adapters_args import add_parser as add_adapter_parsers
    from memforest_gpu.distributed.__main__ import build_parser as build_distributed_parser

    top = argparse.ArgumentParser()
    add_adapter_parsers(top.add_subparsers(dest="cmd"))
    for argv, parser in ((["compress", "a", "b"], build_parser()), (["graph", "compress", "a", "b"], top),
                         (["mem0", "compress", "--config", "c.yaml"], top),
                         (["compress", "a", "b"], build_distributed_parser())):
        a = parser.parse_args(argv + ["--preset", "paper", "--size-weight", "0.2"])
        p = preset("paper")
        want = dataclasses.replace(p, spanning=dataclasses.replace(p.spanning, size_weight=0.2))
        assert config_from_args(a) == want, argv
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["compress"].format_help().split())
    assert "memforest: 0.001, paper: 0.05" in text  # --alpha
    assert "memforest: matching, paper: sequential" in text  # --schedule
    assert "(default: 0.5)" in text  # --ratio: the same in every preset
