"""Merging with vLLM in-process: every prompt of a round in one ``LLM.generate`` call.

    >>> m = VLLMMerger("/models/Qwen2.5-7B-Instruct", dtype="bfloat16", tensor_parallel_size=1,
    ...                gpu_memory_utilization=0.85, max_tokens=256)
    >>> texts = m.merge(pairs)          # one generate() for all pairs, one for the retries

The engine object (``vllm.LLM``) is built once, on :meth:`load` or the first ``merge``;
sampling is greedy (``temperature=0``) with a fixed ``seed``. Prompts are rendered with
the model's own chat template (``llm.get_tokenizer().apply_chat_template``) and passed
as token ids (so no second BOS is added). vLLM
schedules the whole batch itself (continuous batching), so a round of any size is one
call.

Choices that depend on vLLM's documented behaviour:

- ``gpu_memory_utilization`` is the share of the device's *total* memory this engine may
  take (docs.vllm.ai, engine arguments: "a per-instance limit"), and vLLM refuses to start
  when less than that share is free ("Free memory on device ... on startup is less than
  desired GPU memory utilization", vllm-project/vllm#20305). The store and the embedder
  are on the same GPU when ``--device cuda``, so by default (``None``) the share is computed
  at :meth:`~VLLMMerger.load` (the first merge, after they are placed) from the memory
  actually free then, less ``memory_reserve_gib`` for the engine's own tensors:
  :func:`free_memory_utilization`.
- Under ``torchrun`` every rank builds its own engine with
  ``distributed_executor_backend="external_launcher"`` (vLLM's ``ExecutorWithExternalLauncher``,
  "specially designed for torchrun-compatible launchers ... we only create one worker per
  executor"; examples/offline_inference/torchrun_example.py and torchrun_dp_example.py):
  ranks in groups of ``tensor_parallel_size`` form one engine, the groups are vLLM
  data-parallel replicas that each generate their own rank's prompts, all with the same
  ``seed``. That executor reads ``RANK`` and ``LOCAL_RANK`` from the environment (``env://``),
  puts the rank's worker on ``cuda:LOCAL_RANK`` (so every GPU of the node must stay visible
  to every rank) and requires ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which :meth:`~VLLMMerger.load`
  sets. See :func:`engine_kwargs`.
- ``model`` is a model directory or hub name in safetensors form: GGUF loading left vLLM's
  core for the ``vllm-gguf-plugin`` package (vllm-project/vllm#39612, vLLM 0.24).
"""
from __future__ import annotations

import importlib.util
import math
import os

import torch

from ..config import ConfigError
from .llm import LLMMerger, render_chat

__all__ = ["VLLMMerger", "free_memory_utilization", "engine_kwargs", "torchrun_world"]

_GIB = 2 ** 30


def free_memory_utilization(device=None, *, reserve_gib: float = 2.0, mem_get_info=None) -> float:
    """The ``gpu_memory_utilization`` that fits in the memory free on ``device`` now:
    ``(free - reserve_gib) / total``, rounded down to 0.01, at most 0.95.

    ``mem_get_info`` (default ``torch.cuda.mem_get_info``) returns (free, total) bytes.

    >>> free_memory_utilization(mem_get_info=lambda d: (60 * 2**30, 80 * 2**30), reserve_gib=4)
    0.7
    """
    if mem_get_info is None:
        mem_get_info = torch.cuda.mem_get_info
    free, total = mem_get_info(device)
    util = min(0.95, math.floor((free - reserve_gib * _GIB) / total * 100) / 100)
    if util < 0.05:
        raise ValueError(f"free GPU memory must exceed memory_reserve_gib ({reserve_gib:g} GiB) by 5% of the device "
                         f"for vLLM, got {free / _GIB:.1f} GiB free of {total / _GIB:.1f} GiB")
    return util


def torchrun_world(env=None) -> tuple[int, int] | None:
    """(world size, local rank) when this process was started by torchrun with more than one
    rank."""
    env = os.environ if env is None else env
    if "LOCAL_RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = int(env["WORLD_SIZE"])
    return (world, int(env["LOCAL_RANK"])) if world > 1 else None


def engine_kwargs(*, dtype: str, tensor_parallel_size: int, gpu_memory_utilization: float, seed: int,
                  max_model_len: int | None = None, engine_options: dict | None = None, env=None,
                  device_count: int | None = None) -> dict:
    """The keyword arguments of ``vllm.LLM`` (see the module docstring). Under torchrun:
    ``distributed_executor_backend="external_launcher"`` and ``data_parallel_size =
    world / tensor_parallel_size``; ``device_count`` (default: CUDA devices visible) must
    show ``cuda:LOCAL_RANK``. ``engine_options`` override everything."""
    kw = dict(dtype=dtype, tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
              seed=seed)
    if max_model_len is not None:
        kw["max_model_len"] = max_model_len
    run = torchrun_world(env)
    if run is not None:
        world, local = run
        if world % tensor_parallel_size:
            raise ConfigError("tensor_parallel_size", f"must divide the torchrun world size ({world}), "
                             f"got {tensor_parallel_size}")
        if device_count is None:
            device_count = torch.cuda.device_count()
        if local >= device_count:
            raise ValueError(f"LOCAL_RANK must name a visible GPU for vLLM's external launcher (cuda:{local}), got "
                             f"{device_count} visible; do not restrict each rank to one GPU "
                             "(memforest_gpu.distributed: --no-pin-gpu)")
        kw.update(distributed_executor_backend="external_launcher", data_parallel_size=world // tensor_parallel_size)
    kw.update(engine_options or {})
    return kw

_EXTRA = "pip install 'memforest-gpu[vllm]' (Linux with a CUDA GPU)"


class VLLMMerger(LLMMerger):
    """vLLM offline batched generation; see the module docstring. ``engine_options`` are
    passed to ``vllm.LLM`` unchanged (e.g. ``{"enforce_eager": True, "quantization": "awq"}``).
    ``gpu_memory_utilization=None``: computed at load from the memory free then, less
    ``memory_reserve_gib`` (:func:`free_memory_utilization`)."""

    name = "vllm"

    def __init__(self, model: str, *, dtype: str = "auto", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float | None = None, memory_reserve_gib: float = 2.0, max_tokens: int = 256,
                 max_model_len: int | None = None, seed: int = 0, slack: int = 12,
                 engine_options: dict | None = None):
        super().__init__(slack=slack, max_tokens=max_tokens)
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(f"the vllm merger needs the 'vllm' package: {_EXTRA}")
        if not isinstance(model, str) or not model:
            raise ConfigError("model", f"must be a model directory or name, got {model!r}")
        if model.lower().endswith(".gguf"):
            raise ConfigError("model", "must be a model directory or hub name (safetensors): GGUF in vLLM needs the "
                             "vllm-gguf-plugin package and a tokenizer; use the transformers merger for GGUF, "
                             f"got {model!r}")
        if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) \
                or tensor_parallel_size < 1:
            raise ConfigError("tensor_parallel_size", f"must be an integer >= 1, got {tensor_parallel_size!r}")
        if gpu_memory_utilization is not None and (
                isinstance(gpu_memory_utilization, bool) or not isinstance(gpu_memory_utilization, (int, float))
                or not 0 < gpu_memory_utilization <= 1):
            raise ConfigError("gpu_memory_utilization", f"must be in (0, 1] or None, got {gpu_memory_utilization!r}")
        if isinstance(memory_reserve_gib, bool) or not isinstance(memory_reserve_gib, (int, float)) \
                or memory_reserve_gib < 0:
            raise ConfigError("memory_reserve_gib", f"must be a number >= 0, got {memory_reserve_gib!r}")
        self.model = model
        self.dtype = dtype
        self.tensor_parallel_size = tensor_parallel_size
        self.gpu_memory_utilization = None if gpu_memory_utilization is None else float(gpu_memory_utilization)
        self.memory_reserve_gib = float(memory_reserve_gib)
        self.max_model_len = max_model_len
        self.seed = seed
        self.engine_options = dict(engine_options or {})
        self.llm_ = None

    def __repr__(self) -> str:
        return f"VLLMMerger({self.model!r}, dtype={self.dtype!r}, tensor_parallel_size={self.tensor_parallel_size})"

    def identity(self) -> dict:
        return {**super().identity(), "dtype": self.dtype, "seed": self.seed}

    def load(self) -> None:
        if self.llm_ is not None:
            return
        import vllm

        util = self.gpu_memory_utilization
        if util is None:  # now: the store and the embedder are already on the GPU
            util = free_memory_utilization(reserve_gib=self.memory_reserve_gib)
        self.kwargs_ = engine_kwargs(dtype=self.dtype, tensor_parallel_size=self.tensor_parallel_size,
                                     gpu_memory_utilization=util, seed=self.seed, max_model_len=self.max_model_len,
                                     engine_options=self.engine_options)
        if self.kwargs_.get("distributed_executor_backend") == "external_launcher":
            # ExecutorWithExternalLauncher asserts this ("To get deterministic execution, please set
            # VLLM_ENABLE_V1_MULTIPROCESSING=0"): the engine must run in this rank's process
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.llm_ = vllm.LLM(model=self.model, **self.kwargs_)
        self.sampling_ = vllm.SamplingParams(temperature=0.0, max_tokens=self.max_tokens, seed=self.seed)

    def _generate(self, conversations: list[list[dict]]) -> list[str | None]:
        self.load()
        tok = self.llm_.get_tokenizer()
        # token ids, not text: vLLM would add a second BOS to a template that writes one
        ids = tok([render_chat(tok, c) for c in conversations], add_special_tokens=False)["input_ids"]
        outs = self.llm_.generate([{"prompt_token_ids": list(x)} for x in ids], self.sampling_, use_tqdm=False)
        texts: list[str | None] = []
        for o in outs:  # vLLM returns outputs in the order of the prompts
            c = o.outputs[0] if o.outputs else None
            texts.append(c.text if c is not None else None)
            self._count_tokens(len(o.prompt_token_ids or ()), len(c.token_ids) if c is not None else 0)
        return texts
