"""The flags of ``memforest eval`` and their checks before anything loads (the run:
:mod:`.eval`; the paths, under the path rule: :mod:`.eval_checks`)."""
from __future__ import annotations

import argparse

from ..config import FILLS, PRESETS
from .flags import add_keys_arguments, add_renamed_flag, check_number_lists, refuse_ignored
from .path_checks import need_input

__all__ = ["add_parser", "add_arguments", "check", "RATIOS", "STREAM_ONLY"]

RATIOS = "0.3,0.5,0.7"  # --ratios
STREAM_ONLY = {"budgets": "0.7,0.5,0.3", "low_water": 0.8, "no_full_reference": False, "rerun": False}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``memforest eval``."""
    p.add_argument("--benchmark", required=True,
                   help="benchmark folder (nodes.jsonl|parquet + questions.jsonl), a LoCoMo or LongMemEval .json "
                        "file or a PersonaMem questions .csv, read as published")
    p.add_argument("--out", default=None,
                   help="output folder: results.json, per_question.npz, results.md, retention.png")
    p.add_argument("--nodes", default="turns",
                   help="turns (one node per dialogue turn or message) | facts (LoCoMo: one node per fact of its "
                        "observation field, the shape of a Mem0 store) | sessions (LongMemEval: one node per "
                        "session); --leave-one-out also takes turns,facts (both shapes, selected on their mean)")
    p.add_argument("--turns-per-node", type=int, default=1,
                   help="LoCoMo .json only, turns only: consecutive turns per node (4: the long-memory variant)")
    p.add_argument("--methods", default="default",
                   help="comma list of NAME[:SCHEDULE]; 'default' (baselines + memforest, both schedules), "
                        "'ablations', or 'all'")
    p.add_argument("--ratios", default=RATIOS, help="fractions of nodes removed")
    p.add_argument("--seeds", default="0,1,2", help="seeds, one run per method, ratio and seed")
    p.add_argument("--cache", default=None, help="embedding cache folder (default: OUT/.cache)")
    p.add_argument("--embedder", default="default", help="default (all-MiniLM-L6-v2) | model PATH")
    p.add_argument("--merger", default="extractive", help="extractive")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    g = p.add_argument_group("retrieval and cuts")
    g.add_argument("-k", "--k", type=int, default=10, help="nodes at the @k cut")
    g.add_argument("--max-tokens", type=int, default=256, metavar="TOKENS", help="whitespace tokens at the @B cut")
    add_renamed_flag(g, "--budget", "--max-tokens", "max_tokens", type=int)
    g.add_argument("--fill", default="plain", choices=FILLS,
                   help="@B context: plain (whole nodes: the protocol) | pooled (what memforest search "
                        "--max-tokens shows) | ...")
    g.add_argument("--L", type=int, default=4, help="AGPR candidate multiplier")
    g.add_argument("--lam", type=float, default=0.2, help="AGPR anchor fraction")
    g.add_argument("--gamma", type=float, default=0.9, help="AGPR similarity weight")
    g = p.add_argument_group("MemForest config: the --preset with these fields changed (as in memforest compress); "
                             "ablations override their own field")
    g.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="named configuration the flags below start from (default: memforest, the same as "
                        "memforest compress; paper: the paper's values); a bare 'memforest' method takes its schedule")
    g.add_argument("--alpha", type=float, default=None, help="clusters per node")
    g.add_argument("--beta", type=float, default=None, help="semantic weight in the reassignment")
    g.add_argument("--window", type=int, default=None, help="temporal window, in positions")
    g.add_argument("--max-iter", type=int, default=None, help="at most this many Lloyd steps")
    g.add_argument("--seeding", default=None, help="k-means seeding: batched | k-means|| | k-means++")
    g.add_argument("--eta", type=float, default=None, help="similarity weight in the degree-adjusted score")
    g.add_argument("--degree-norm", default=None, help="none | max")
    g.add_argument("--time-weight", type=float, default=None,
                   help="weight of local time on tree edges (0: cosine only, the paper)")
    g.add_argument("--time-window", type=int, default=None, help="positions that count as neighbours on edges")
    g.add_argument("--time-rule", default=None, help="scaled | gated | flat: what a neighbour's bonus needs")
    g.add_argument("--time-min-cos", type=float, default=None, help="gated: the cosine a neighbour needs")
    g.add_argument("--size-weight", type=float, default=None,
                   help="penalty on tree edges per merged length in units of size_unit tokens (0: the paper)")
    g.add_argument("--graph", default=None, help="knn | dense: the trees' candidate graph (default: knn)")
    g.add_argument("--knn", type=int, default=None, help="neighbours per node in the knn graph (default: 16)")
    g.add_argument("--max-node-tokens", type=int, default=None, help="node length cap (default: embedder's)")
    g.add_argument("--cap-policy", default=None, help="condense | strict: a merge over the node cap")
    add_keys_arguments(g)
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--reference", default=None,
                   help="the method every other one is compared with (cluster bootstrap; default: memforest with "
                        "the preset's schedule when it runs, else memforest:sequential)")
    p.add_argument("--export", default=None, help="only write the benchmark in the nodes + questions format here")
    p.add_argument("--report-only", action="store_true", help="redo tables and plot from OUT's results")
    _add_protocol_arguments(p)
    _add_loo_arguments(p)
    _add_stream_arguments(p)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: the grid's tensor ops are small; 0 = torch's default)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no note of a slow model load")


def _add_loo_arguments(p: argparse.ArgumentParser) -> None:
    """``--leave-one-out`` and its ``--loo-*`` flags."""
    g = p.add_argument_group("leave-one-conversation-out tuning (evaluation/loo.py)")
    g.add_argument("--leave-one-out", action="store_true",
                   help="choose a MemForest config per fold on the other conversations, score it on the held-out "
                        "one; writes OUT/loo.md and OUT/loo.json")
    g.add_argument("--loo-schedules", default="sequential,matching", help="candidate schedules")
    g.add_argument("--loo-alphas", default="0.05,0.01,0.001", help="candidate alphas")
    g.add_argument("--loo-time-weights", default="0,0.5", help="candidate time weights")
    g.add_argument("--loo-time-rules", default="scaled,gated:0.2,gated:0.3,gated:0.4",
                   help="candidate time rules (gated:COS sets its time_min_cos); with time weight 0 the rule does "
                        "not matter and the candidate is run once")
    g.add_argument("--loo-compare-rules", default="flat",
                   help="time rules scored on the preset's config (the other flags) for comparison only, never "
                        "selected (flat: the 0/1 neighbour bonus); '' for none")
    g.add_argument("--loo-size-weights", default="0,0.2", help="candidate size weights")
    g.add_argument("--loo-keys", default=None,
                   help="candidate retrieval rules of merged nodes: text (its text's vector alone) or K:TEXT_WEIGHT "
                        "(K keys, or all, blended with the text), e.g. text,all:0.5,3:0.5 (default: the base config's)")
    g.add_argument("--loo-from", default=None,
                   help="comma list of loo_scores.npz files of earlier --leave-one-out runs: join their candidates "
                        "and redo the selection without running anything")
    g.add_argument("--loo-select", default="B:ansr_content",
                   help="selection metric CUT:METRIC, plain top-k retention (B:ansr_content | B:ansr | k:evr | B:evr)")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``eval`` sub-command to a ``memforest`` sub-parser set."""
    p = subparsers.add_parser("eval", help="measure compression quality on a benchmark (docs/evaluation.md)",
                              description="Run methods x ratios x seeds on a benchmark and write results.")
    add_arguments(p)
    return p


def _add_protocol_arguments(p: argparse.ArgumentParser) -> None:
    """``--contexts``, ``--tenants``, ``--max-questions`` and the LLM protocol's flags."""
    g = p.add_argument_group("published benchmarks (LoCoMo, LongMemEval, PersonaMem): which part")
    g.add_argument("--contexts", default=None,
                   help="PersonaMem: the shared_contexts_*.jsonl of the questions .csv (default: the published name "
                        "beside it)")
    g.add_argument("--skip-missing-contexts", action="store_true",
                   help="PersonaMem: evaluate the questions whose shared_context_id is in the contexts file and skip "
                        "(count, and report) the others (default: such a question stops the run, naming its row)")
    g.add_argument("--tenants", default=None,
                   help="comma list: only these tenants (LoCoMo: sample ids; LongMemEval: question ids; PersonaMem: "
                        "CONTEXT@END)")
    g.add_argument("--max-questions", type=int, default=None,
                   help="at most N questions, spread evenly over the file (after --tenants)")
    g = p.add_argument_group("LLM protocol: answers from the top-k memories, judged CORRECT / WRONG "
                             "(docs/evaluation.md, 'Reproduce the paper's protocol')")
    g.add_argument("--answer-model", default=None,
                   help="who answers: NAME (a model of the OpenAI-compatible server at --base-url) | openai:NAME | "
                        "vllm:PATH | transformers:PATH (a model directory or .gguf file)")
    g.add_argument("--judge-model", default=None,
                   help="who judges, the same forms (default: no judge; multiple-choice questions need none)")
    g.add_argument("--base-url", default=None,
                   help="the OpenAI-compatible server (default http://127.0.0.1:8000/v1; key from OPENAI_API_KEY)")
    g.add_argument("--answer-max-tokens", type=int, default=64, help="tokens an answer may take")
    g.add_argument("--judge-max-tokens", type=int, default=16, help="tokens a verdict may take")
    g.add_argument("--llm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a back-end option, as the mergers take it: max_concurrency=32 (server), batch_size=8, "
                        "device=cpu (transformers), tensor_parallel_size=2 (vllm) ...")


def check_protocol_flags(a) -> None:
    """The LLM protocol runs on the grid only: refuse its flags with --leave-one-out or --stream
    rather than ignore them."""
    mode = "--leave-one-out" if getattr(a, "leave_one_out", False) else "--stream" if getattr(a, "stream", False) \
        else None
    if mode and (getattr(a, "answer_model", None) or getattr(a, "judge_model", None)):
        raise ValueError(f"--answer-model and --judge-model score the grid; {mode} runs without them, got "
                         f"--answer-model {a.answer_model!r}")


def _add_stream_arguments(p: argparse.ArgumentParser) -> None:
    """``--stream`` and the flags of the streaming replay."""
    g = p.add_argument_group("streaming replay (evaluation/stream.py, docs/compaction.md)")
    g.add_argument("--stream", action="store_true",
                   help="replay the benchmark session by session, compacting every tenant to its budget after each "
                        "session; compare with one offline compress to the same size (default methods: "
                        "memforest:matching,tome,kmeans_prune)")
    g.add_argument("--budgets", default=STREAM_ONLY["budgets"],
                   help="--stream: budgets, fractions of each tenant's final size")
    g.add_argument("--low-water", type=float, default=STREAM_ONLY["low_water"],
                   help="--stream: a tenant over budget keeps LOW_WATER x budget")
    g.add_argument("--no-full-reference", action="store_true",
                   help="--stream: skip re-running compress on the whole store after every session")
    g.add_argument("--rerun", action="store_true",
                   help="--stream: also compress every memory so far, uncompressed, after every session")


def check(a) -> None:
    """Every check of ``eval``'s flags that needs no file read: the number lists, the flags a
    mode would ignore (the streaming replay's without ``--stream``, the grid's with it, the LLM
    protocol's outside the grid), and the benchmark it reads."""
    check_number_lists(a, {"ratios": float, "seeds": int, "budgets": float, "loo_alphas": float,
                           "loo_time_weights": float, "loo_size_weights": float})
    if a.stream:
        refuse_ignored(a, {"nodes": "turns", "turns_per_node": 1, "ratios": RATIOS, "leave_one_out": False,
                           "contexts": None, "skip_missing_contexts": False, "tenants": None, "max_questions": None},
                       "does not apply to --stream (it replays the benchmark's nodes session by session to --budgets)")
    else:
        refuse_ignored(a, STREAM_ONLY, "applies only with --stream")
    mode = "--leave-one-out" if a.leave_one_out else "--stream" if a.stream else None
    if mode and (a.answer_model or a.judge_model):
        raise ValueError(f"--answer-model and --judge-model score the grid; {mode} runs without them, got "
                         f"--answer-model {a.answer_model!r}")
    if not (a.report_only or a.loo_from):
        need_input(a.benchmark, "benchmark")
