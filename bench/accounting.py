"""Stage accounting: each stage's work against what the machine allows for it.

A compression is run once more under a counting mode (:class:`WorkCounter`, a
``TorchDispatchMode``) that sees every tensor operation, times it (the device synchronised
around it) and books it to the engine stage it runs in (``StageTimer`` stages: partition,
setup, plan, merge, embed, apply, output). Operations fall in two classes:

- **matrix products** (``mm``, ``bmm``, ``addmm``, ``baddbmm``): FLOPs = 2 * m * n * k per
  product. Their achieved rate is compared with ``torch.mm`` / ``torch.bmm`` timed alone on
  the same shapes and dtype on the same machine in the same run (:func:`matmul_rates`).
- **data movement** (everything else that reads or writes memory: elementwise, reductions,
  sorts, gathers, scatters, copies): bytes = what the operation reads and writes (a gather
  or scatter counts the rows it moves, not the whole table). Compared with a plain copy of
  a large buffer (:func:`copy_rate`).

Per stage the record gives seconds (the normal run's, and the counted run's split), FLOPs
and their achieved rate as a % of ``torch.mm``'s, bytes and their rate as a % of a copy's,
and the stage's floor: the time its products would take at ``torch.mm``'s rate plus its
bytes at a copy's rate. ``efficiency`` = floor / seconds says how far the stage is from
the hardware. Views and metadata operations move nothing and are not counted. The text
stages (the merger, the output's strings) are mostly Python, outside this count:
:func:`text_floor` compares them with the cheapest code that writes texts of the same size.

On a GPU the same records come out of ``bench/gpu_compress.py`` (``bench/gpu.sh``).
"""
from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memforest_gpu.timer as timer_mod

__all__ = ["WorkCounter", "count_stages", "matmul_rates", "copy_rate", "account", "format_accounting", "text_floor",
           "text_stages"]

_MATMULS = {"mm", "bmm", "addmm", "baddbmm"}
_NO_MOVE = {"view", "_unsafe_view", "expand", "slice", "select", "t", "transpose", "permute", "as_strided", "unsqueeze",
            "squeeze", "alias", "detach", "lift_fresh", "_reshape_alias", "unbind", "split", "split_with_sizes",
            "chunk", "narrow", "empty", "empty_like", "empty_strided", "new_empty", "set_", "resize_", "unfold",
            "is_nonzero", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "view_as_real"}
_GATHERS = {"index_select", "gather", "index", "take", "embedding", "take_along_dim"}
_SCATTERS = {"index_put", "index_put_", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
             "scatter_reduce_", "index_add", "index_add_", "index_copy", "index_copy_", "masked_scatter_",
             "_index_put_impl_"}


def _nbytes(x) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _sync(dev_type: str) -> None:
    if dev_type == "cuda":
        torch.cuda.synchronize()


class WorkCounter(TorchDispatchMode):
    """Per stage: matrix-product FLOPs, seconds and shapes; bytes moved and seconds of the rest."""

    def __init__(self):
        super().__init__()
        self.stage = "other"
        self.flops = defaultdict(float)
        self.mm_seconds = defaultdict(float)
        self.bytes = defaultdict(float)
        self.move_seconds = defaultdict(float)
        self.shapes = defaultdict(lambda: defaultdict(float))  # stage -> (op, shapes, dtype) -> flops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in _NO_MOVE:
            return func(*args, **kwargs)
        ins = list(_tensors(args)) + list(_tensors(list(kwargs.values())))
        dev = ins[0].device.type if ins else "cpu"
        _sync(dev)
        t = time.perf_counter()
        out = func(*args, **kwargs)
        _sync(dev)
        dt = time.perf_counter() - t
        outs = list(_tensors(out))
        if name in _MATMULS:
            a, b = (ins[-2], ins[-1])
            lead = a.shape[:-2] if a.dim() == 3 else ()
            bsz = int(torch.tensor(lead).prod()) if lead else 1
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            f = 2.0 * bsz * m * n * k
            self.flops[self.stage] += f
            self.mm_seconds[self.stage] += dt
            key = ("bmm" if a.dim() == 3 else "mm", (bsz, m, k, n), str(a.dtype).replace("torch.", ""))
            self.shapes[self.stage][key] += f
            return out
        if name in _GATHERS:
            moved = 2 * sum(_nbytes(o) for o in outs) + sum(_nbytes(x) for x in ins if x.dtype in (torch.int64,
                                                                                                    torch.int32))
        elif name in _SCATTERS:
            src = [x for x in ins[1:] if x.dtype not in (torch.int64, torch.int32, torch.bool)]
            moved = 2 * sum(_nbytes(x) for x in src) + sum(_nbytes(x) for x in ins if x.dtype in (torch.int64,
                                                                                                   torch.int32))
        else:
            moved = sum(_nbytes(x) for x in ins) + sum(_nbytes(o) for o in outs)
        self.bytes[self.stage] += moved
        self.move_seconds[self.stage] += dt
        return out


@contextlib.contextmanager
def _booking(counter: WorkCounter):
    """Within the block, every engine stage (``StageTimer.stage``) sets the counter's stage."""
    real = timer_mod.StageTimer.stage

    @contextlib.contextmanager
    def stage(self, name):
        before, counter.stage = counter.stage, name
        try:
            with real(self, name):
                yield
        finally:
            counter.stage = before

    timer_mod.StageTimer.stage = stage
    try:
        yield
    finally:
        timer_mod.StageTimer.stage = real


def count_stages(fn) -> WorkCounter:
    """Run ``fn()`` under a :class:`WorkCounter`, booking work to the engine's stages."""
    counter = WorkCounter()
    with _booking(counter), counter:
        fn()
    return counter


def matmul_rates(shapes: dict, device, *, repeats: int = 3, top: int = 6) -> dict:
    """FLOP/s of ``torch.mm`` / ``torch.bmm`` alone on the shapes (the ``top`` by FLOPs) of
    ``shapes`` ({(op, (b, m, k, n), dtype): flops}); returns {key: flop/s}."""
    rates = {}
    for key in sorted(shapes, key=lambda x: -shapes[x])[:top]:
        op, (b, m, k, n), dtype = key
        dt = getattr(torch, dtype)
        A = torch.randn(b, m, k, device=device).to(dt)
        B = torch.randn(b, k, n, device=device).to(dt)
        f = torch.bmm if op == "bmm" else (lambda x, y: torch.mm(x[0], y[0]))
        f(A, B)
        best = float("inf")
        for _ in range(repeats):
            _sync(torch.device(device).type)
            t = time.perf_counter()
            f(A, B)
            _sync(torch.device(device).type)
            best = min(best, time.perf_counter() - t)
        rates[key] = 2.0 * b * m * n * k / max(best, 1e-9)
    return rates


def copy_rate(device, *, mb: int = 256, repeats: int = 3) -> float:
    """Bytes/s of a plain copy of a ``mb`` MB buffer (read + write counted, as above)."""
    src = torch.empty(mb << 18, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        _sync(torch.device(device).type)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(torch.device(device).type)
        best = min(best, time.perf_counter() - t)
    return 2 * _nbytes(src) / best


def account(counter: WorkCounter, seconds: dict, device) -> dict:
    """One record per stage (module docstring) from a counted run and a normal run's seconds."""
    copy = copy_rate(device)
    out = {"copy_GBps": copy / 1e9}
    for stage in sorted(set(counter.flops) | set(counter.bytes) | set(k for k in seconds if k != "total")):
        flops, fsec = counter.flops.get(stage, 0.0), counter.mm_seconds.get(stage, 0.0)
        nbytes, bsec = counter.bytes.get(stage, 0.0), counter.move_seconds.get(stage, 0.0)
        rates = matmul_rates(counter.shapes.get(stage, {}), device) if flops else {}
        covered = sum(counter.shapes[stage][k] for k in rates)
        mm_rate = covered / sum(counter.shapes[stage][k] / r for k, r in rates.items()) if rates else 0.0
        floor = (flops / mm_rate if mm_rate else 0.0) + nbytes / copy
        sec = seconds.get(stage, fsec + bsec)
        out[stage] = {
            "seconds": sec, "counted_mm_s": fsec, "counted_move_s": bsec,
            "gflop": flops / 1e9, "gflops": flops / fsec / 1e9 if fsec else 0.0, "mm_gflops": mm_rate / 1e9,
            "mm_pct": 100.0 * (flops / fsec) / mm_rate if fsec and mm_rate else None,
            "gbytes": nbytes / 1e9, "gbps": nbytes / bsec / 1e9 if bsec else 0.0,
            "copy_pct": 100.0 * (nbytes / bsec) / copy if bsec else None,
            "floor_s": floor, "efficiency_pct": 100.0 * floor / sec if sec else None,
            "top_products": [f"{op}{list(s)} {dt}" for op, s, dt in list(rates)[:3]],
        }
    return out


def format_accounting(acc: dict) -> str:
    """The accounting as a table, one line per stage."""
    lines = [f"# stage accounting (copy {acc['copy_GBps']:.1f} GB/s; products vs torch.mm on the same shapes)",
             f"# {'stage':<10} {'s':>8} {'GFLOP':>9} {'GFLOP/s':>8} {'%mm':>5} {'GB':>8} {'GB/s':>6} {'%copy':>6} "
             f"{'floor s':>8} {'eff%':>5}"]
    for stage, r in acc.items():
        if not isinstance(r, dict):
            continue

        def pct(v):
            return f"{v:5.0f}" if v is not None else "    -"
        lines.append(f"# {stage:<10} {r['seconds']:8.2f} {r['gflop']:9.1f} {r['gflops']:8.1f} {pct(r['mm_pct'])} "
                     f"{r['gbytes']:8.2f} {r['gbps']:6.1f} {pct(r['copy_pct'])} {r['floor_s']:8.2f} "
                     f"{pct(r['efficiency_pct'])}")
    return "\n".join(lines)


def text_floor(texts: list[str]) -> float:
    """Microseconds per text of the cheapest code that writes the same texts: writing each
    one's bytes once (UTF-8). A merger or an output that makes these texts does at least that."""
    t = time.perf_counter()
    n = sum(len(x.encode("utf-8")) for x in texts)
    dt = time.perf_counter() - t
    return 1e6 * dt / max(1, len(texts)) if n >= 0 else 0.0


def text_stages(seconds: dict, merges: list, out_texts) -> dict:
    """The text stages against :func:`text_floor`: the merger (``merge`` seconds over the
    merges' texts) and the output (``output`` seconds over the output's texts)."""
    merged = [m.text for m in merges if m.text is not None]
    out = {}
    if merged:
        per = 1e6 * seconds.get("merge", 0.0) / len(merged)
        floor = text_floor(merged)
        out["merge"] = {"us_per_merge": per, "floor_us": floor, "x_floor": per / floor if floor else None}
    texts = list(out_texts)
    if texts:
        per = 1e6 * seconds.get("output", 0.0) / len(texts)
        floor = text_floor(texts)
        out["output"] = {"us_per_row": per, "floor_us": floor, "x_floor": per / floor if floor else None}
    return out


if __name__ == "__main__":  # a module the benchmarks import: run alone, it only explains itself
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Imported by other bench/ scripts (bench/README.md); it runs nothing "
                                   "by itself.").parse_args()
