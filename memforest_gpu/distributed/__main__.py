"""``torchrun --nproc-per-node N -m memforest_gpu.distributed compress IN OUT [options]``

Without torchrun (``python -m memforest_gpu.distributed compress ...``) it runs as one rank.
Each flag maps to a config field, as in ``memforest compress``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from ..cli.flags import (
    CLI_NAMES,
    add_config_arguments,
    config_from_args,
    error_message,
    interrupted_message,
    parse_options,
)
from ..cli.report import format_report
from ..mergers import MissingOptionError, get_merger
from ..runs.errors import OPTION_WORDS
from ..runs.preflight import preflight
from ..store.atomic import atomic_write_text
from .files import compress_file_distributed

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m memforest_gpu.distributed",
                                 description="Compress one memory store with several processes (one per GPU).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compress", help="compress IN into OUT; rank 0 writes OUT")
    c.add_argument("input")
    c.add_argument("output")
    add_config_arguments(c, two_level=False)  # split tenants run the sharded exact k-means
    c.add_argument("--embedder", default="auto", help="auto | default | none | PATH (as in memforest compress)")
    c.add_argument("--merger", default="extractive", help="merger name (each rank builds its own)")
    c.add_argument("--merger-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the merger, e.g. model=/models/qwen (VALUE read as JSON when it parses)")
    c.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    c.add_argument("--backend", default="auto", help="auto (nccl on CUDA, else gloo) | nccl | gloo")
    c.add_argument("--no-pin-gpu", action="store_true",
                   help="do not restrict each rank to GPU LOCAL_RANK (CUDA_VISIBLE_DEVICES)")
    c.add_argument("--split-above", type=int, default=None,
                   help="spread the trees of tenants larger than this over ranks (default: tenants whose cost "
                        "alone exceeds a fair share)")
    c.add_argument("--format", default=None, help="input format: parquet | jsonl (default: from the suffix)")
    c.add_argument("--out-format", default=None, help="output format (default: from the suffix)")
    c.add_argument("--report", default=None, help="also write the run report (with the per-rank plan) as JSON")
    c.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from each rank's OUTPUT.rankR.journal.jsonl without redoing "
                        "its merges (same input, options and number of ranks)")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def _pin_gpu() -> None:
    """Give rank LOCAL_RANK only its own GPU, before anything touches CUDA, so that a
    per-rank model (one vLLM engine per GPU) lands on its GPU."""
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        return
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    devs = [d for d in vis.split(",") if d.strip()] if vis else None
    if devs == []:
        return  # no GPU visible: CPU run
    os.environ["CUDA_VISIBLE_DEVICES"] = devs[int(local) % len(devs)] if devs else str(local)


def main(argv: list[str] | None = None) -> int:
    with OPTION_WORDS.as_command():  # warnings name the options as flags
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if not args.no_pin_gpu and args.device != "cpu":
        _pin_gpu()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available() and args.device != "cpu"
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    if backend not in ("nccl", "gloo"):
        print(f"error: backend must be one of ['auto', 'nccl', 'gloo'], got {args.backend!r}", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if cuda else "cpu")
    if device.startswith("cuda") and cuda:
        torch.cuda.set_device(0 if os.environ.get("LOCAL_RANK") and not args.no_pin_gpu
                              else int(os.environ.get("LOCAL_RANK", "0")))
        device = f"cuda:{torch.cuda.current_device()}"
    if world > 1:
        dist.init_process_group(backend)
    try:
        cfg = config_from_args(args)
        options = parse_options(args.merger_option)
        try:
            merger = get_merger(args.merger, **options)  # bad names and options fail here, on every rank
        except MissingOptionError as e:  # this command takes a merger's options as --merger-option pairs
            raise ValueError(e.message(f"--merger-option {e.missing[0]}=...")) from None

        # the output never overwrites the input, and a bad target fails before any work
        preflight(args.input, args.output, format=args.format, out_format=args.out_format, report=args.report,
                  lock=False, journal=False, names=CLI_NAMES)  # rank 0 writes OUTPUT whole at the end
        res = compress_file_distributed(args.input, args.output, cfg, merger=merger, embedder=args.embedder,
                                        device=device, split_above=args.split_above, format=args.format,
                                        out_format=args.out_format, resume=args.resume,
                                        progress=not args.quiet and rank == 0 and sys.stderr.isatty())
        if rank == 0:
            print(format_report(res.report))
            if res.replayed:
                print(f"resumed: {res.replayed} merges replayed from the ranks' journals (not sent to the mergers)")
            if res.split:
                print(f"trees of {len(res.split)} tenant(s) spread over ranks: {', '.join(res.split[:5])}"
                      + (" ..." if len(res.split) > 5 else ""))
            print(f"{world} rank(s), backend {backend if world > 1 else 'none'}: "
                  + ", ".join(f"rank {r} {len(p)} item(s)" for r, p in enumerate(res.plan)))
            print(f"wrote {args.output}")
            if args.report:
                d = res.report.to_dict()
                d["plan"], d["split"] = res.plan, res.split
                atomic_write_text(args.report, json.dumps(d, indent=2, default=str))
        if world > 1:
            dist.barrier()
        return 0
    except (ValueError, OSError, ImportError, RuntimeError) as e:
        where = f"[rank {rank}] " if world > 1 else ""
        print(f"{where}memforest_gpu.distributed {args.cmd}: error: {error_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: what this rank kept, how to resume, no traceback
        where = f"[rank {rank}] " if world > 1 else ""
        print(f"{where}memforest_gpu.distributed {args.cmd}: {interrupted_message(e)}", file=sys.stderr)
        return 130
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
