"""The flags shared by every command that compresses (``compress``, ``mem0 compress``,
``graph compress``, ``python -m memforest_gpu.distributed compress``): one flag per config
field and the :class:`~memforest_gpu.config.CompressConfig` they build, ``--merger-option``
pairs, and the cheap check of an ``--embedder`` value. Light: it imports the configs alone,
so every flag is checked before torch loads."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from ..config import DEFAULT_PRESET, PRESETS, VECTOR_CODES, ConfigError, preset

__all__ = ["add_config_arguments", "config_from_args", "as_flag_error", "check_embedder_flag", "parse_options",
           "FIELDS", "check_number_lists", "refuse_ignored", "add_keys_arguments", "keys_count", "check_text_weight",
           "flag_of", "add_renamed_flag"]


#: flag dest -> (stage, field) of CompressConfig; ``seed`` sets both the partition's and the merge's
FIELDS = {
    "ratio": ("merge", "ratio"), "schedule": ("merge", "schedule"), "max_node_tokens": ("merge", "max_node_tokens"),
    "alpha": ("partition", "alpha"), "beta": ("partition", "beta"), "window": ("partition", "window"),
    "max_iter": ("partition", "max_iter"), "kmeans": ("partition", "kmeans"), "seeding": ("partition", "seeding"),
    "eta": ("spanning", "eta"), "degree_norm": ("spanning", "degree_norm"), "time_weight": ("spanning", "time_weight"),
    "time_window": ("spanning", "time_window"), "time_rule": ("spanning", "time_rule"),
    "time_min_cos": ("spanning", "time_min_cos"), "size_weight": ("spanning", "size_weight"),
    "cap_policy": ("merge", "cap_policy"), "keep_pattern": ("merge", "keep_pattern"),
    "merge_within": ("merge", "merge_within"), "graph": ("spanning", "graph"), "knn": ("spanning", "knn"),
    "knn_cells_above": ("spanning", "knn_cells_above"), "knn_above": ("spanning", "knn_above"),
    "keys": ("merge", "keys"), "text_weight": ("merge", "text_weight"), "vectors": ("merge", "vectors"),
}


def keys_count(value: str) -> int:
    """``--keys``: an integer, or ``all`` (every source: -1)."""
    if value.strip().lower() == "all":
        return -1
    try:
        k = int(value)
    except ValueError:
        k = -1
    if k < 0:  # -1 means every source inside the config; on the command line that is 'all'
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 or 'all', got {value!r}")
    return k


def add_keys_arguments(g, h=lambda text, dest: text) -> None:
    """``--keys`` and ``--text-weight``: what merged nodes are searched by (MergeConfig.keys)."""
    g.add_argument("--keys", type=keys_count, default=None, metavar="K",
                   help=h("key vectors a merged node keeps to be found by: its sources' own, or K centres of them "
                          "when it has more (all: every source; 0: none, its text's vector alone)", "keys"))
    g.add_argument("--text-weight", type=float, default=None,
                   help=h("a node with keys scores TEXT_WEIGHT * cos(text) + (1 - TEXT_WEIGHT) * its best key's "
                          "cos", "text_weight"))
    g.add_argument("--vectors", choices=list(VECTOR_CODES), default=None,
                   help=h("how the output file holds its vectors (text vectors and keys): float32, or int8 codes (a "
                          "quarter of the bytes, the same search)", "vectors"))


def _presets_help(dest: str) -> str:
    """A field's default for --help: ``"0.5"`` when every preset agrees, else ``"the
    preset's; memforest: 0.001, paper: 0.05"``."""

    stage, name = FIELDS[dest]
    values = {p: getattr(getattr(c, stage), name) for p, c in PRESETS.items()}
    if len(set(values.values())) == 1:
        return str(next(iter(values.values())))
    return "the preset's; " + ", ".join(f"{p}: {v}" for p, v in values.items())


def add_config_arguments(p: argparse.ArgumentParser, *, two_level: bool = True) -> None:
    """Add the flags of :func:`config_from_args`: ``--preset`` (default ``memforest``) and one
    flag per field, each overriding only its own field of the preset (``--help`` shows every
    preset's value). ``two_level=False`` leaves out ``--kmeans`` for commands that only run
    exact k-means."""

    def h(text: str, dest: str) -> str:
        return f"{text} (default: {_presets_help(dest)})".replace("%", "%%")

    p.add_argument("--preset", default=DEFAULT_PRESET, choices=list(PRESETS),
                   help=f"named configuration the flags below start from (default {DEFAULT_PRESET}: chosen by "
                        "leave-one-conversation-out on LoCoMo; paper: the paper's values); a flag given overrides "
                        "only its own field")
    p.add_argument("--ratio", type=float, default=None, help=h("fraction of each tenant's nodes to remove", "ratio"))
    p.add_argument("--schedule", default=None,
                   help=h("sequential (each tree merges its best pair per round) | matching (disjoint pairs "
                          "per round)", "schedule"))
    p.add_argument("--seed", type=int, default=0, help="random seed (k-means++ seeding)")
    g = p.add_argument_group("event partition (k-means over meaning and time)")
    g.add_argument("--alpha", type=float, default=None,
                   help=h("clusters per node (K = floor(alpha*N); 0: one tree per tenant)", "alpha"))
    g.add_argument("--beta", type=float, default=None, help=h("semantic weight in the reassignment", "beta"))
    g.add_argument("--window", type=int, default=None, help=h("temporal window, in positions", "window"))
    g.add_argument("--max-iter", type=int, default=None, help=h("at most this many Lloyd steps", "max_iter"))
    g.add_argument("--seeding", default=None,
                   help=h("k-means seeding: batched (D^2 sampling in growing batches) | k-means|| (a few "
                          "oversampling rounds, then the seeds drawn from the candidates) | k-means++ (one "
                          "centre a step)", "seeding"))
    if two_level:
        g.add_argument("--kmeans", default=None,
                       help=h("exact | two-level (sub-quadratic: coarse cells, then k-means inside each; "
                              "for tenants of tens of thousands of nodes and more)", "kmeans"))
    g = p.add_argument_group("trees and merge order")
    g.add_argument("--eta", type=float, default=None, help=h("similarity weight in the degree-adjusted score", "eta"))
    g.add_argument("--degree-norm", default=None, help=h("none | max (the authors' code)", "degree_norm"))
    g.add_argument("--time-weight", type=float, default=None,
                   help=h("weight of local time on tree edges (0 = the paper: cosine only)", "time_weight"))
    g.add_argument("--time-window", type=int, default=None,
                   help=h("positions apart that count as neighbours on edges", "time_window"))
    g.add_argument("--time-rule", default=None,
                   help=h("what a neighbour's time bonus needs: scaled (the bonus times the cosine) | gated (the "
                          "bonus only from --time-min-cos up) | flat (a 0/1 bonus whatever the cosine)", "time_rule"))
    g.add_argument("--time-min-cos", type=float, default=None,
                   help=h("the cosine a neighbour needs for the bonus under --time-rule gated", "time_min_cos"))
    g.add_argument("--size-weight", type=float, default=None,
                   help=h("penalty on the merged node's length, in units of size_unit tokens (0 = the paper)",
                          "size_weight"))
    g.add_argument("--graph", default=None,
                   help=h("knn (each node's --knn best neighbours plus its next in time: memory grows with N) | "
                          "dense (every pair of a tree: the reference, memory grows with the trees' squares)",
                          "graph"))
    g.add_argument("--knn", type=int, default=None,
                   help=h("neighbours per node in the knn graph (a tree of at most knn+1 nodes keeps every pair)",
                          "knn"))
    g.add_argument("--knn-cells-above", type=int, default=None,
                   help=h("trees of more nodes search their neighbours in cells (approximate)", "knn_cells_above"))
    g.add_argument("--knn-above", type=int, default=None,
                   help=h("trees padded to at most this many slots keep every pair (cheaper when small)", "knn_above"))
    g.add_argument("--max-node-tokens", type=int, default=None,
                   help="cap on merged node length (default: the embedder's limit)")
    g.add_argument("--storage-dtype", default=None,
                   help="float32 | float16 | bfloat16: the vectors the trees read (half precision: a half copy "
                        "of the store's; cosines stay float32) (default: float32)")
    g.add_argument("--cap-policy", default=None,
                   help=h("condense (a merge over the cap keeps its most informative sentences, so the ratio is "
                        "reached) | strict (pairs over the cap are not merged; the ratio may fall short) | keep "
                        "(no cap: the text is kept whole, the keys find what the embedder does not read)",
                        "cap_policy"))
    add_keys_arguments(p.add_argument_group("what merged nodes are searched by (kept in the store)"), h)
    g = p.add_argument_group("what may merge")
    g.add_argument("--keep-pattern", default=None, metavar="REGEX",
                   help="nodes whose text matches this regular expression (RE2, anywhere in the text; anchor with ^) "
                        "are never merged; the ratio applies to the others (default: none; graph compress: M3-Agent's "
                        "identity lines, '(?i)^equivalence')")
    g.add_argument("--merge-within", default=None, metavar="KEY",
                   help="nodes merge only with nodes of the same group: 'timestamp' (equal timestamps, e.g. a clip) or "
                        "a metadata KEY (equal values) (default: none; an M3-Agent graph: timestamp, its clip)")


def config_from_args(a: argparse.Namespace):
    """The :class:`~memforest_gpu.config.CompressConfig` of parsed flags: the ``--preset``'s
    (``memforest`` when the namespace has none), with every flag that was given replacing
    its own field. A bad value raises ``ValueError`` naming the flag (``--degree-norm must
    be ...``); an unknown preset names the valid ones."""

    try:
        base = preset(getattr(a, "preset", None) or DEFAULT_PRESET)
        changes: dict[str, dict] = {"partition": {"seed": a.seed}, "spanning": {}, "merge": {"seed": a.seed}}
        for dest, (stage, name) in FIELDS.items():
            value = getattr(a, dest, None)
            if value is not None:
                changes[stage][name] = value
        cfg = dataclasses.replace(base, **{stage: dataclasses.replace(getattr(base, stage), **kw)
                                           for stage, kw in changes.items()})
        if getattr(a, "storage_dtype", None) is not None:
            cfg = dataclasses.replace(cfg, storage_dtype=a.storage_dtype)
    except ConfigError as e:
        raise ValueError(as_flag_error(e, a)) from None
    check_text_weight(a, cfg)
    return cfg


def check_text_weight(a: argparse.Namespace, cfg) -> None:
    """``--text-weight`` weighs a merged node's keys: refused where the config keeps none
    (``keys`` 0) unless it is 1 (the text alone), where it would be ignored."""
    if getattr(a, "text_weight", None) not in (None, 1.0) and cfg.merge.keys == 0:
        why = "--keys 0" if getattr(a, "keys", None) is not None else \
            f"the {getattr(a, 'preset', None) or DEFAULT_PRESET} preset's keys 0"
        raise ValueError(f"--text-weight applies to merged nodes that keep keys (--keys K or all), got {why} (merged "
                         f"nodes are searched by their text alone) with --text-weight {a.text_weight:g}")


def as_flag_error(e: Exception, a: argparse.Namespace) -> str:
    """The message of ``e`` in the command line's words: a
    :class:`~memforest_gpu.config.ConfigError` of a field that is one of the parsed options
    names its flag (``degree_norm must be ...`` -> ``--degree-norm must be ...``); any other
    error keeps its message."""
    if isinstance(e, ConfigError) and e.field in vars(a):
        return e.named(flag_of(e.field))
    return str(e)


def flag_of(dest: str) -> str:
    """The flag of an option (``max_tokens`` -> ``--max-tokens``, ``k`` -> ``-k``)."""
    return ("-" if len(dest) == 1 and dest.islower() else "--") + dest.replace("_", "-")


def check_number_lists(a: argparse.Namespace, kinds: dict) -> None:
    """Refuse a comma-list flag (``dest -> float or int``) holding something that is not a
    number, naming the flag, before any work."""
    for dest, kind in kinds.items():
        text = getattr(a, dest, None)
        for x in (text or "").split(","):
            try:
                if x.strip():
                    kind(x)
            except ValueError:
                what = "integers" if kind is int else "numbers"
                raise ValueError(f"{flag_of(dest)} must be a comma list of {what}, got {text!r}") from None


def refuse_ignored(a: argparse.Namespace, defaults: dict, rule: str) -> None:
    """Refuse a flag given a value other than its default (``dest -> default``) where the
    command would ignore it: ``rule`` says why (``"applies only with --stream"``)."""
    for dest, default in defaults.items():
        value = getattr(a, dest, default)
        if value != default:
            shown = "" if isinstance(value, bool) else f" {value}"
            raise ValueError(f"{flag_of(dest)} {rule}, got {flag_of(dest)}{shown}")


def check_embedder_flag(spec: str, *, allowed=("auto", "default", "none"), flag: str = "--embedder") -> None:
    """A cheap check of an ``--embedder`` value, before any file is read or model loaded."""
    if spec in allowed or os.path.isdir(spec):
        return
    raise ValueError(f"{flag} must be one of {list(allowed)} or a local model directory, got {spec!r}")


def parse_options(pairs: list[str], flag: str = "--merger-option") -> dict:
    """``["model=/m", "max_tokens=128"]`` -> ``{"model": "/m", "max_tokens": 128}``; a pair
    without ``=`` is refused naming ``flag``."""
    out = {}
    for p in pairs:
        if "=" not in p or not p.split("=", 1)[0].strip():
            raise ValueError(f"{flag} must be KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k.strip().replace("-", "_")] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip().replace("-", "_")] = v
    return out


class _RenamedFlag(argparse.Action):
    """A renamed flag's old spelling, hidden from ``--help``: it sets the new flag's value and
    says on stderr that it is renamed."""

    def __init__(self, option_strings, dest, *, new: str, **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"memforest: {option_string} is renamed {self.new}; {option_string} goes in the next release",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_flag(p, old: str, new: str, dest: str, **kw) -> None:
    """Keep ``old`` working for one release as a hidden alias of the flag ``new`` (``dest``)."""
    p.add_argument(old, dest=dest, action=_RenamedFlag, new=new, help=argparse.SUPPRESS, default=argparse.SUPPRESS,
                   **kw)
