"""The file layout both store formats share (:mod:`.io` describes it): the columns a file must
and may hold, and the key of the JSON Lines header that records the embedder."""

__all__ = ["REQUIRED_COLUMNS", "OPTIONAL_COLUMNS", "HEADER_KEY", "TREE_COLUMN"]

REQUIRED_COLUMNS = ("id", "text", "timestamp")
# keys_rule: the keys' rule (JSON) on every row that has keys, and embedder: the model of the vectors on every
# row (Parquet, :mod:`.embedder_io`), so that a tool that keeps the columns and drops the file's metadata
# (pandas, Polars, DuckDB) keeps them too
OPTIONAL_COLUMNS = ("embedding", "tenant", "sources", "metadata", "tree", "keys", "key_sources", "keys_rule",
                    "embedder")
TREE_COLUMN = "tree"  # a node's event tree (compact's state, :mod:`.event_trees`); null = not placed yet
HEADER_KEY = "__memforest__"
