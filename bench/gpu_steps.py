"""The steps of the GPU verification run (bench/gpu.py runs each in its own process).

    python bench/gpu_steps.py first_round --out runs/gpu [--rehearse]

Each step appends its records to ``<out>/gpu_records.jsonl`` as it goes (bench/gpu_record.py).
``--rehearse``: the same code at tiny sizes on the CPU. Nothing here imports torch or
memforest_gpu at module level, so bench/gpu.py can read :data:`STEPS` before the project
is importable.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
if os.path.join(ROOT, "tests") not in sys.path:  # tests/host_reads.py: the host-read counter
    sys.path.append(os.path.join(ROOT, "tests"))

from gpu_agree import step_agreement  # noqa: E402
from gpu_compress import step_compress  # noqa: E402
from gpu_ctx import Ctx, fast_store, frac_equal, noisy_queries  # noqa: E402
from gpu_record import RECORDS, append_record  # noqa: E402


@dataclass(frozen=True)
class Step:
    name: str
    limit_s: float  # on a GPU
    rehearse_s: float  # rehearsal on the CPU
    what: str


# in order of value; limits sum to about the 470 s budget (bench/gpu.py stops at the budget anyway)
STEPS = [
    Step("agreement", 110, 60,
         "CUDA agreement: pytest on CUDA, kernels CUDA vs CPU, Triton vs PyTorch, engine invariants"),
    Step("compress", 170, 60, "1M nodes d=384, the default preset and --preset paper: a whole compress, seconds "
                              "and peak device memory by stage, rounds, host reads and H2D copies; then each "
                              "stage's FLOPs and bytes against the device (bench/accounting.py) at 200,000 nodes"),
    Step("first_round", 45, 40, "1M nodes d=384: partition + trees + the first round's pairs (a dry run), host reads"),
    Step("kmeans", 35, 30, "k-means assignment TFLOP/s against the measured matmul ceiling"),
    Step("merge", 55, 60, "LLM merges/s and tokens/s (Qwen2.5 0.5B and 7B shapes, random weights) + MiniLM "
                          "re-embedding"),
    Step("retrieval", 45, 30, "1M nodes, 10k batched queries: top-k and AGPR"),
    Step("optional", 20, 30, "faiss-gpu and vLLM, where importable"),
]

SIZES = {
    "gpu": dict(
        pytest=[("kernels", ["tests/test_kernels_*.py"], 30),  # globs are expanded in the checkout
                ("triton", ["tests/test_triton_kernels.py", "-m", "not slow"], 15),
                ("engine", ["tests/test_engine*.py", "-m", "not slow"], 35),
                ("gpu_marked", ["tests", "-m", "gpu"], 25)],
        agree_n=20000, agree_k=512, agree_d=384, agree_trees=(64, 48), agree_q=2000, agree_store=4000,
        compress_n=1_000_000, compress_dim=384, compress_tenants=8, compress_two_level_min=20000,
        accounting_n=200_000,
        first_round_n=1_000_000, first_round_dim=384, first_round_tenants=8,
        first_round_kmeans=("two-level", "exact"),
        matmul=8192, assign_n=1_000_000, assign_k=50_000, assign_d=384, reps=2,
        # a throughput figure per model size: the small model at a small and a large batch, the 7B at one
        lms={"qwen2.5-0.5b": [256, 1024], "qwen2.5-7b": [256]}, vllm_batches=[256, 1024], out_tokens=64,
        bpe_vocab=16000,
        enc_batches=[256, 1024],
        ret_n=1_000_000, ret_q=10_000, ret_dim=384, ret_tenants=(1, 64), k=10,
        faiss_n=1_000_000, faiss_q=10_000),
    "rehearse": dict(
        pytest=[("triton", ["tests/test_triton_*.py", "-k", "all_invalid or module_level or switched_off"],
                 40)],
        agree_n=600, agree_k=24, agree_d=16, agree_trees=(4, 12), agree_q=50, agree_store=300,
        compress_n=3000, compress_dim=32, compress_tenants=3, compress_two_level_min=1000,
        accounting_n=1500,
        first_round_n=3000, first_round_dim=32, first_round_tenants=3, first_round_kmeans=("two-level", "exact"),
        matmul=256, assign_n=2000, assign_k=64, assign_d=32, reps=2,
        lms={"tiny-qwen2": [2, 4]}, vllm_batches=[2, 4], out_tokens=6, bpe_vocab=800, enc_batches=[4, 8],
        ret_n=5000, ret_q=200, ret_dim=32, ret_tenants=(1, 4), k=10,
        faiss_n=3000, faiss_q=100),
}


def step_first_round(ctx: Ctx) -> None:
    """Step 3: the dry run of a 1M-node store (partition + trees + the first round's pairs), per
    k-means kind, with host reads: :func:`memforest_gpu.engine.dry_run`."""
    from host_reads import count_host_reads

    from memforest_gpu import CompressConfig, MergeConfig, PartitionConfig
    from memforest_gpu.engine import dry_run
    from memforest_gpu.kernels.triton_assign import fallback_reasons

    s = ctx.size
    t0 = time.perf_counter()
    store = fast_store(s["first_round_n"], s["first_round_dim"], tenants=s["first_round_tenants"], seed=1,
                       device=ctx.dev)
    build_s = time.perf_counter() - t0
    for kmeans in s["first_round_kmeans"]:
        cfg = CompressConfig(partition=PartitionConfig(kmeans=kmeans, two_level_min_nodes=20000 if not ctx.rehearse
                                                       else 1000),
                             merge=MergeConfig(ratio=0.5, schedule="matching"))
        warm = fast_store(2000, s["first_round_dim"], tenants=2, seed=2, device=ctx.dev)
        dry_run(warm, cfg, device=ctx.dev)  # warm-up
        ctx.reset_peak()
        ctx.sync()
        with count_host_reads() as reads:
            t = time.perf_counter()
            res = dry_run(store, cfg, device=ctx.dev)
            ctx.sync()
            sec = time.perf_counter() - t
        r = res.report
        stages = {f"{k}_s": v for k, v in r.seconds.items()}
        ctx.emit(name=f"first_round_{kmeans}", summary=f"{sec:.2f} s for {len(store):,} nodes ({r.trees:,} trees, "
                 f"{len(res.merges):,} pairs planned), {reads.total:,} host reads",
                 n=len(store), dim=store.dim, tenants=s["first_round_tenants"], kmeans=kmeans, schedule="matching",
                 seconds=sec, **stages, trees=r.trees, planned_pairs=len(res.merges),
                 kmeans_iterations=r.kmeans_iterations, host_reads=reads.total,
                 host_reads_by_name=dict(reads.by_name.most_common()), peak_gpu_mb=ctx.peak_mb(),
                 store_build_s=build_s, triton_fallbacks=fallback_reasons())


def step_kmeans(ctx: Ctx) -> None:
    """Step 4: the dense matmul ceiling of this device, then the k-means assignment against it."""
    import torch

    from memforest_gpu.kernels.assign import best_match
    from memforest_gpu.kernels.triton_assign import fallback_reasons, unavailable_reason

    s = ctx.size
    M = s["matmul"]
    ceiling = {}
    for label, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                               ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(M, M, device=ctx.dev, dtype=dtype)
        b = torch.randn(M, M, device=ctx.dev, dtype=dtype)
        a @ b
        sec, _ = ctx.timed(lambda: a @ b, reps=5)
        ceiling[label] = 2.0 * M ** 3 / sec / 1e12
        ctx.emit(name=f"matmul_{label}", summary=f"{ceiling[label]:.3g} TFLOP/s ({M}^3 matmul)", m=M, dtype=label,
                 seconds=sec, tflops=ceiling[label])
    torch.backends.cuda.matmul.allow_tf32 = False
    n, K, D = s["assign_n"], s["assign_k"], s["assign_d"]
    g = torch.Generator().manual_seed(0)
    gd = torch.Generator(device=ctx.dev).manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(1, n, D, generator=gd, device=ctx.dev), dim=-1)  # (1, n, D)
    C = X[:, torch.randperm(n, generator=g)[:K].to(ctx.dev)].clone()  # (1, K, D)
    cv = torch.ones(1, K, dtype=torch.bool, device=ctx.dev)
    flops = 2.0 * n * K * D
    ref_index = None
    for backend in ("torch", "torch-tf32", "triton"):
        if backend == "triton" and unavailable_reason(ctx.dev) is not None:
            ctx.emit(name="assign_triton", status="skipped", summary=unavailable_reason(ctx.dev))
            continue
        torch.backends.cuda.matmul.allow_tf32 = backend == "torch-tf32"
        call = partial(best_match, X, C, cv, backend="triton" if backend == "triton" else "torch")
        best_match(X[:, :512], C, cv, backend="triton" if backend == "triton" else "torch")  # warm-up / build
        sec, (_, idx) = ctx.timed(call, reps=s["reps"])
        tflops = flops / sec / 1e12
        agree = None
        if ref_index is None:
            ref_index = idx
        else:
            agree = frac_equal(idx, ref_index)
        ctx.emit(name=f"assign_{backend}", summary=f"{tflops:.3g} TFLOP/s = {tflops / ceiling['tf32']:.1%} of TF32, "
                 f"{tflops / ceiling['bf16']:.1%} of bf16, {tflops / ceiling['fp32']:.1%} of fp32 matmul "
                 f"({sec:.3g} s)", n=n, k=K, d=D, backend=backend, seconds=sec, tflops=tflops,
                 frac_of_tf32=tflops / ceiling["tf32"], frac_of_bf16=tflops / ceiling["bf16"],
                 frac_of_fp32=tflops / ceiling["fp32"], labels_equal_to_torch_fp32=agree,
                 triton_fallbacks=fallback_reasons())
    torch.backends.cuda.matmul.allow_tf32 = False


def step_merge(ctx: Ctx) -> None:
    """Step 5: re-embedding and LLM merge throughput with random-weight models (:mod:`gpu_llm`)."""
    from gpu_llm import MINILM_L6, QWEN25, TINY_ENCODER, TINY_LM, encoder_throughput, lm_throughput
    from gpu_merge import sample_pairs

    s = ctx.size
    shapes = {**QWEN25, **TINY_LM}
    enc = TINY_ENCODER if ctx.rehearse else MINILM_L6
    pairs = sample_pairs(64)
    texts = [f"On {p.older.timestamp:.0f}: {p.older.text} Then: {p.newer.text}" for p in pairs]
    # the encoder first: it is cheap, and the 7B model may use the rest of the step
    encoder_throughput(enc, texts, s["enc_batches"], ctx.dev, ctx.emit, vocab=s["bpe_vocab"])
    for name, batches in s["lms"].items():
        if ctx.left() < 10:
            ctx.emit(name=f"merge_{name}", status="skipped", summary="no time left in the step")
            continue
        lm_throughput(name, shapes[name], sample_pairs, batches, s["out_tokens"], ctx.dev, ctx.emit,
                      vocab=s["bpe_vocab"])


def step_retrieval(ctx: Ctx) -> None:
    """Step 6: batched top-k and AGPR over a 1M-node store, one tenant and many."""
    from memforest_gpu import RetrievalConfig, Retriever

    s = ctx.size
    for tenants in s["ret_tenants"]:
        store = fast_store(s["ret_n"], s["ret_dim"], tenants=tenants, big_share=0.5, seed=3, device=ctx.dev)
        q, tens = noisy_queries(store, s["ret_q"])
        r = Retriever(store)
        for agpr in (False, True):
            cfg = RetrievalConfig(k=s["k"], agpr=agpr)
            r.search(q[:64], tenants=tens[:64], config=cfg)  # warm-up
            sec, res = ctx.timed(lambda: r.search(q, tenants=tens, config=cfg), reps=2)
            kind = "agpr" if agpr else "topk"
            ctx.emit(name=f"retrieval_{kind}_t{tenants}", summary=f"{len(q) / sec:,.0f} queries/s ({sec * 1e3:.0f} ms "
                     f"for {len(q):,} queries, {len(store):,} nodes, {tenants} tenants)", n=len(store),
                     tenants=tenants, queries=len(q), k=s["k"], agpr=agpr, seconds=sec, qps=len(q) / sec,
                     hits_found=float((res.index >= 0).float().mean()))


def step_optional(ctx: Ctx) -> None:
    """Step 7: faiss-gpu and vLLM where importable, else a record saying they are not."""
    import importlib.util

    try:
        import faiss
    except ImportError as e:
        ctx.emit(name="faiss", status="skipped", summary=f"faiss not importable: {e}")
    else:
        _faiss(ctx, faiss)
    if importlib.util.find_spec("vllm") is None:
        ctx.emit(name="vllm", status="skipped", summary="vllm not importable")
    elif ctx.dev.type != "cuda":
        ctx.emit(name="vllm", status="skipped", summary="vllm needs CUDA (rehearsal runs on the CPU)")
    else:
        _vllm(ctx)


def _faiss(ctx: Ctx, faiss) -> None:
    from memforest_gpu import RetrievalConfig, Retriever
    from memforest_gpu.retrieval.index import IndexConfig, IndexedRetriever

    s = ctx.size
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    store = fast_store(s["faiss_n"], s["ret_dim"], tenants=1, seed=4, device=ctx.dev)
    q, tens = noisy_queries(store, s["faiss_q"], seed=1)
    cfg = RetrievalConfig(k=s["k"], agpr=True)
    exact = Retriever(store).search(q, tenants=tens, config=cfg)
    for kind in ("faiss-flat", "faiss-ivf"):
        t0 = time.perf_counter()
        r = IndexedRetriever(store, IndexConfig(kind=kind, nprobe=32))
        build = time.perf_counter() - t0
        r.search(q[:64], tenants=tens[:64], config=cfg)
        sec, res = ctx.timed(lambda: r.search(q, tenants=tens, config=cfg), reps=2)
        got = {ix.kind for ix in r.indexes.values()}
        ctx.emit(name=kind, summary=f"{len(q) / sec:,.0f} queries/s on {sorted(got)}, "
                 f"{frac_equal(res.index, exact.index):.4f} of AGPR hits equal to exact", n=len(store),
                 queries=len(q), seconds=sec, qps=len(q) / sec, build_s=build, index_kinds=sorted(got),
                 faiss_gpus=gpus, agreement_with_exact=frac_equal(res.index, exact.index))


def _vllm(ctx: Ctx) -> None:
    """vLLM with dummy (random) weights of the Qwen2.5-0.5B shape: merges/s at the GPU batch sizes."""
    import json

    from gpu_llm import QWEN25, chatml_tokenizer
    from gpu_merge import sample_pairs

    from memforest_gpu.mergers.prompt import SYSTEM_PROMPT, build_messages
    from memforest_gpu.mergers.vllm_offline import VLLMMerger, free_memory_utilization

    pairs = sample_pairs(max(ctx.size["vllm_batches"]))
    with tempfile.TemporaryDirectory() as d:
        tok = chatml_tokenizer([SYSTEM_PROMPT] + [p.older.text for p in pairs], ctx.size["bpe_vocab"])
        tok.save_pretrained(d)
        cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
               **QWEN25["qwen2.5-0.5b"], "bos_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        util = free_memory_utilization(reserve_gib=4.0)
        m = VLLMMerger(d, dtype="bfloat16", max_tokens=ctx.size["out_tokens"], gpu_memory_utilization=util,
                       engine_options={"load_format": "dummy"})
        t0 = time.perf_counter()
        m.load()
        load_s = time.perf_counter() - t0
        import vllm

        m.sampling_ = vllm.SamplingParams(temperature=0.0, max_tokens=m.max_tokens, min_tokens=m.max_tokens, seed=0)
        for b in ctx.size["vllm_batches"]:
            convs = [build_messages(p) for p in pairs[:b]]
            before = dict(m.stats)
            sec, _ = ctx.timed(lambda: m._generate(convs))
            ctok = m.stats["completion_tokens"] - before["completion_tokens"]
            ctx.emit(name=f"vllm_qwen2.5-0.5b_b{b}", summary=f"{b / sec:.1f} merges/s, {ctok / sec:,.0f} gen tok/s",
                     batch=b, seconds=sec, merges_per_s=b / sec, completion_tokens_per_s=ctok / sec, load_s=load_s,
                     gpu_memory_utilization=util, note="vLLM load_format=dummy: random weights, real throughput")


STEP_FUNCS = {"agreement": step_agreement, "compress": step_compress, "first_round": step_first_round,
              "kmeans": step_kmeans, "merge": step_merge,
              "retrieval": step_retrieval, "optional": step_optional}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=list(STEP_FUNCS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--rehearse", action="store_true")
    a = ap.parse_args(argv)
    if a.rehearse:
        # the Triton kernel runs in its interpreter; triton reads this when it is imported
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not a.rehearse and not torch.cuda.is_available():
        append_record(os.path.join(a.out, RECORDS), step=a.step, name="step", status="fail",
                      summary="no CUDA device (use --rehearse on a CPU)")
        return 1
    if a.rehearse:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    STEP_FUNCS[a.step](Ctx(a.step, a.out, a.rehearse, SIZES["rehearse" if a.rehearse else "gpu"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
