"""The tenants of a Parquet store, known before anything else loads: ``search`` without
``--tenant`` on a store of several tenants is refused at once, not after the model has loaded
and the store has been embedded.

The footer's statistics tell a store of one tenant without reading a row; the tenant column
alone is read only when they do not (no statistics, or several values: then its names are
listed). A JSON Lines store is read whole to know its tenants, so its check stays with the
search, which reads it anyway. Arrow is imported here, when a Parquet store is probed, so that
building the parser stays light.
"""
from __future__ import annotations

import os

__all__ = ["parquet_tenants", "check_tenant_given", "UNNAMED"]

#: what a store calls the rows without a tenant (store/column_checks.py ``DEFAULT_TENANT``)
UNNAMED = "default"
PARQUET_SUFFIXES = (".parquet", ".pq")


def _one_by_statistics(meta, col: int) -> bool:
    """True when every row group's statistics show the same single, named tenant."""
    seen = set()
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(col).statistics
        if st is None or not st.has_min_max or st.null_count or st.min != st.max or not st.min:
            return False
        seen.add(st.min)
    return len(seen) == 1


def parquet_tenants(path: str) -> list[str] | None:
    """The tenants of the Parquet store ``path`` in order of first appearance (rows without
    one are :data:`UNNAMED`); ``None`` when one tenant holds every row. Reads the footer, and
    the tenant column only when the footer does not tell."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if "tenant" not in names:
        return None
    col = names.index("tenant")
    if pf.metadata.num_rows == 0 or _one_by_statistics(pf.metadata, col):
        return None
    values = pf.read(columns=["tenant"]).column(0).cast("large_string")
    values = pc.if_else(pc.equal(values, ""), None, values).fill_null(UNNAMED)
    found = pc.unique(values).to_pylist()
    return found if len(found) > 1 else None


def check_tenant_given(path: str, tenant: str | None) -> None:
    """``--tenant`` must be given for a Parquet store of several tenants (names the first 20)."""
    if tenant is not None or os.path.splitext(path)[1].lower() not in PARQUET_SUFFIXES or not os.path.isfile(path):
        return
    try:
        found = parquet_tenants(path)
    except Exception:  # noqa: BLE001 - not a Parquet file Arrow reads: the search's own reading says why
        return
    if found:
        shown = str(found) if len(found) <= 20 else f"{found[:20]}... ({len(found)} tenants)"
        raise ValueError(f"--tenant must be given for a store with several tenants, one of {shown}")
