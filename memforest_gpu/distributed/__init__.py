"""Scale-out with torch.distributed: one store compressed by N processes (one per GPU).

    torchrun --nproc-per-node 4 -m memforest_gpu.distributed compress IN.parquet OUT.parquet
    --ratio 0.5

Every rank reads the input; whole tenants (and, for a tenant too large for one rank, its
EventTrees) are balanced over ranks by cost; each rank has its own merger (e.g. one vLLM
engine per GPU) and embedder; rank 0 gathers the rows and writes one output, atomically.
The output equals the single-process ``memforest compress`` of the same store and seed
(see :mod:`.runner` and :mod:`.kmeans` for the two caveats). NCCL on GPUs, gloo on CPU.
Each rank journals its merges (:mod:`.files`), so an interrupted run resumes
(``--resume``, ``resume=True``) without asking a merger again for a journaled pair.
"""
from .files import compress_file_distributed
from .kmeans import partition_tenant, shard_range, sharded_kmeans
from .ranks import RankFailedError
from .runner import DistributedResult, compress_distributed
from .workload import WorkItem, balance, cost, tenants_to_split

__all__ = ["compress_distributed", "compress_file_distributed", "DistributedResult", "RankFailedError",
           "sharded_kmeans", "partition_tenant", "shard_range", "balance", "cost", "tenants_to_split", "WorkItem"]
