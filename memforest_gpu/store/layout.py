"""The file layout both store formats share (:mod:`.io` describes it): the columns a file must
and may hold, and the key of the JSON Lines header that records the embedder."""

__all__ = ["REQUIRED_COLUMNS", "OPTIONAL_COLUMNS", "HEADER_KEY"]

REQUIRED_COLUMNS = ("id", "text", "timestamp")
OPTIONAL_COLUMNS = ("embedding", "tenant", "sources", "metadata")
HEADER_KEY = "__memforest__"
