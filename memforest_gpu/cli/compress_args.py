"""The flags of ``memforest compress`` and their checks before anything loads (the run:
:mod:`.compress`)."""
from __future__ import annotations

from ..sizes import parse_size
from .flags import add_config_arguments, check_embedder_flag, config_from_args
from .path_checks import need_input, need_writable
from .review_args import add_review_argument, check_review_path

__all__ = ["add_parser", "check", "merger_options", "MERGER_FLAGS"]

#: option name -> the mergers that take it (the flag is its dashed form)
MERGER_FLAGS = {
    "model": ("transformers", "vllm", "openai"), "base_url": ("openai",), "api_key_env": ("openai",),
    "max_concurrency": ("openai",), "timeout": ("openai",), "max_retries": ("openai",),
    "max_tokens": ("transformers", "vllm", "openai"), "batch_size": ("transformers",),
    "dtype": ("transformers", "vllm"), "tensor_parallel_size": ("vllm",), "gpu_memory_utilization": ("vllm",),
}


def add_parser(sub) -> None:
    c = sub.add_parser("compress", help="compress a store (Parquet or JSONL) into a new file",
                       description="Compress a memory store (Parquet or JSONL) into a new file; the input is "
                                   "never modified.")
    c.add_argument("input", help="the store to compress (.parquet, .pq, .jsonl, .ndjson or .json)")
    c.add_argument("output", help="the compressed store to write (a new path; its suffix sets the format)")
    c.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    add_config_arguments(c)
    c.add_argument("--embedder", default="auto",
                   help="auto: embed a store without vectors with all-MiniLM-L6-v2, re-embed with a store's "
                        "recorded model, else merged vectors are the mean of their inputs | default "
                        "(all-MiniLM-L6-v2) | none (mean) | PATH (a local sentence-transformers model)")
    c.add_argument("--merger", default="extractive",
                   help="who writes merged text: extractive (no model) | transformers (local model dir or .gguf) | "
                        "vllm (in-process, GPU) | openai (any OpenAI-compatible server)")
    c.add_argument("--model", default=None, help="LLM mergers: model directory, .gguf file, or served model name")
    c.add_argument("--base-url", default=None, help="openai: endpoint, e.g. http://127.0.0.1:8000/v1")
    c.add_argument("--api-key-env", default=None, help="openai: environment variable holding the API key "
                                                       "(default OPENAI_API_KEY; none sent when unset)")
    c.add_argument("--max-concurrency", type=int, default=None, help="openai: requests in flight (default 16)")
    c.add_argument("--timeout", type=float, default=None, help="openai: seconds per request (default 120)")
    c.add_argument("--max-retries", type=int, default=None, help="openai: retries per request (default 3)")
    c.add_argument("--max-tokens", type=int, default=None, help="LLM mergers: tokens per merged text (default 256)")
    c.add_argument("--batch-size", type=int, default=None, help="transformers: prompts per generate (default 8)")
    c.add_argument("--dtype", default=None,
                   help="transformers/vllm: auto | float16 | bfloat16 | float32 (default: auto)")
    c.add_argument("--tensor-parallel-size", type=int, default=None, help="vllm: GPUs per model (default 1)")
    c.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vllm: fraction of GPU memory for the model and KV cache "
                        "(default: what is free when the model loads, less 2 GiB)")
    c.add_argument("--format", default=None, help="input format: parquet | jsonl (default: from the suffix)")
    c.add_argument("--out-format", default=None, help="output format: parquet | jsonl (default: from the suffix)")
    c.add_argument("--report", default=None, help="also write the run report as JSON to this path (default: none)")
    c.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from OUTPUT.journal.jsonl without redoing its merges")
    c.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="compress tenant groups that fit SIZE (e.g. 4G, 512M) one at a time, for stores bigger "
                        "than memory; same output as without it (default: the whole store at once)")
    c.add_argument("--dry-run", action="store_true",
                   help="print the first round's planned merges (pairs, similarity) and write nothing")
    c.add_argument("--quiet", action="store_true",
                   help="no progress bars (shown only when stderr is a terminal), no --memory-budget progress "
                        "lines, no note of a slow model load")
    add_review_argument(c)


def merger_options(a) -> dict:
    """The merger's options given as flags; a flag of another merger is refused, naming it."""
    opts = {}
    for name, mergers in MERGER_FLAGS.items():
        value = getattr(a, name)
        if value is None:
            continue
        if a.merger not in mergers:
            raise ValueError(f"--{name.replace('_', '-')} applies to the {' / '.join(mergers)} merger(s), "
                             f"got --merger {a.merger}")
        opts[name] = value
    if a.merger == "transformers" and a.device is not None:
        opts["device"] = a.device
    return opts


def check(a) -> None:
    """Every check of ``compress`` that needs nothing loaded: the config's flags, the budget,
    the flags that exclude each other, the merger's flags, the files read and written."""
    config_from_args(a)
    if a.memory_budget is not None:
        parse_size(a.memory_budget, flag="--memory-budget")
        if a.dry_run:
            raise ValueError("--memory-budget cannot be combined with --dry-run (a dry run plans the first round "
                             "of the whole store): drop one of them")
    if a.dry_run and a.report:
        raise ValueError("--report applies to a run that compresses, got --dry-run (a dry run prints its plan and "
                         "writes nothing): drop one of them")
    check_embedder_flag(a.embedder)
    merger_options(a)
    need_input(a.input)
    if not a.dry_run:
        need_writable("OUTPUT", a.output)
    need_writable("--report", a.report)
    check_review_path(a.review)
