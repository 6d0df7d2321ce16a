"""Opening a Mem0 store for memforest: its config, the ``Memory``, its entity store, and
its embedding model as a memforest embedder."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from ...mergers.embedders import count_words
from .config_file import check_config, load_config
from .service_checks import check_dims, given_dims, one_line, preflight, store_dim
from .vectors import check_provider, provider_of
from .vectors_pg import pg_table_dim

__all__ = ["load_config", "load_memory", "close_memory", "entity_store", "Mem0Embedder", "check_dimension"]


def load_memory(config: dict | str | os.PathLike, *, create: bool = False, quiet: bool = False):
    """A Mem0 ``Memory`` from a config dict or file, for a store that exists. Before Mem0
    opens anything (:func:`.service_checks.preflight`): the server must answer and accept the
    login, the collection (table) must exist and hold vectors of the dimension the config
    states; once open, of the dimension of the embedder's vectors. Each failure is one
    ``ValueError`` line, and nothing is written to the store (Mem0 creates its history
    database as it opens, when there is none). ``create``: the collection may be missing
    (Mem0 creates it), to build a store or to restore into an emptied one. ``quiet``: no
    progress bar while Mem0 loads its embedding model. Telemetry is off unless
    ``MEM0_TELEMETRY`` says otherwise. memforest never calls Mem0's LLM (adds use
    ``infer=False``); a config without an ``llm`` section gets a placeholder so that Mem0
    starts without an API key."""
    cfg = dict(load_config(config) if not isinstance(config, dict) else config)
    if isinstance(config, dict):
        check_config(cfg)
    vs = cfg.get("vector_store") or {}
    check_provider(vs.get("provider", "qdrant") if isinstance(vs, dict) else vs)  # before Mem0 connects anywhere
    if isinstance(vs, dict):
        preflight(cfg, create=create)
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # Chroma's own telemetry
    try:
        from mem0 import Memory
    except ImportError:
        raise ImportError("the Mem0 adapter needs mem0ai: pip install 'memforest-gpu[mem0]'") from None
    cfg.setdefault("llm", {"provider": "openai", "config": {"api_key": "unused-by-memforest", "model": "unused"}})
    given = given_dims(cfg)
    try:
        with _no_progress_bars(quiet):
            memory = Memory.from_config(cfg)
    except RuntimeError as e:
        if "already accessed" in str(e):
            raise ValueError(f"the Qdrant folder is open in another process ({e}); stop the application that "
                             "uses it, or point Mem0 at a Qdrant server") from None
        raise
    except ValueError as e:  # pydantic's ValidationError: Mem0 refuses the config
        raise ValueError(f"Mem0 must accept the config, got: {one_line(e)}") from None
    try:
        given["the embedder's vectors"] = Mem0Embedder(memory).dim
        check_dimension(memory, store_dim(memory), given)
    except BaseException:
        close_memory(memory)
        raise
    return memory


@contextlib.contextmanager
def _no_progress_bars(quiet: bool):
    """transformers' progress bars off in the block when ``quiet`` (then as they were)."""
    hf = None
    if quiet:
        try:
            from transformers.utils import logging as hf
        except ImportError:
            hf = None
    was = hf.is_progress_bar_enabled() if hf is not None else None
    if hf is not None:
        hf.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf.enable_progress_bar()


def check_dimension(memory, stored: int | None, given: dict) -> None:
    """Each dimension in ``given`` (what -> dimension) must be ``stored``, the dimension of the
    vectors in ``memory``'s store (one ``ValueError`` line otherwise)."""
    check_dims(provider_of(memory), memory.vector_store.collection_name, stored, given)


def close_memory(memory) -> None:
    """Release a ``Memory``: its history database and its vector store client (an embedded
    Qdrant folder stays locked until then; pgvector's connection pools are closed)."""
    memory.close()
    close = getattr(getattr(memory.vector_store, "client", None), "close", None)
    if callable(close):
        close()
    for vs in (memory.vector_store, getattr(memory, "_entity_store", None)):
        pool = getattr(vs, "connection_pool", None)
        closeall = getattr(pool, "closeall", None) or getattr(pool, "close", None)
        if callable(closeall) and not getattr(pool, "closed", False):
            closeall()


def entity_store(memory):
    """Mem0's entity store (``<collection>_entities``) when the store has one, else None;
    never creates it."""
    if getattr(memory, "_entity_store", None) is not None:
        return memory._entity_store
    vs = memory.vector_store
    name = f"{vs.collection_name}_entities"
    provider = provider_of(memory)
    if provider == "qdrant":
        exists = vs.client.collection_exists(name)
    elif provider == "chroma":
        exists = name in {getattr(c, "name", c) for c in vs.client.list_collections()}
    elif provider == "pgvector":
        with vs._get_cursor() as cur:
            exists = pg_table_dim(cur, name)[0]
    else:
        exists = bool(vs.path) and os.path.exists(os.path.join(vs.path, f"{name}.faiss"))
    return memory.entity_store if exists else None


class Mem0Embedder:
    """Mem0's embedding model as a memforest embedder, so merged text gets the vectors Mem0
    itself would store. ``embed(texts) -> (N, D)`` float32, rows L2-normalised."""

    def __init__(self, memory, *, device=None):
        self.model = memory.embedding_model
        ec = memory.config.embedder
        self.name = f"mem0:{ec.provider}:{getattr(self.model.config, 'model', None)}"
        self._dim = None  # the dimension of the embedder's own vectors, probed once
        st = getattr(self.model, "model", None)  # the sentence-transformers model of the huggingface provider
        self._tok = getattr(st, "tokenizer", None)
        self.max_tokens = int(st.max_seq_length) if getattr(st, "max_seq_length", None) else None
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed(["dimension probe"]).shape[1])
        return int(self._dim)

    def count_tokens(self, texts):
        if self._tok is None:
            return count_words(texts)
        enc = self._tok(list(texts), add_special_tokens=False, truncation=False, verbose=False)
        return [len(x) for x in enc["input_ids"]]

    def embed(self, texts) -> torch.Tensor:
        """Shape: (N,) texts -> (N, D)"""
        texts = list(texts)
        if not texts:
            return torch.empty(0, self._dim or 0, device=self.device)
        batch = getattr(self.model, "embed_batch", None)
        rows = batch(texts, "add") if batch is not None else [self.model.embed(t, "add") for t in texts]
        e = torch.as_tensor(np.asarray(rows, dtype=np.float32), device=self.device)
        return torch.nn.functional.normalize(e, dim=1)
