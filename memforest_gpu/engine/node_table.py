"""The growing node table of one compression run: originals ``0..N-1``, merged nodes appended.

One place for what a merge does to a node's bookkeeping (docs/method.md section 3), shared by the
engine and the merging baselines so both follow the same rules:

- the pair goes to the merger older first: by timestamp, then by the earliest original inside;
- the merged node: id :func:`merged_id` of its sources, timestamp ``max(t_a, t_b)``,
  ``sources_a + sources_b``, tenant unchanged, metadata ``{**meta_a, **meta_b}`` plus
  ``merged_from`` (the two ids);
- output order: live nodes by the earliest original inside (originals keep their order).

Columnar: the originals are the store's own Arrow columns (never copied); numeric columns
(timestamp, tenant code, earliest original, originals inside, a merged row's two parents) are
numpy arrays over all rows; only merged rows' ids and texts (M of them, whose text the merger
makes anyway) are Python lists. A merged row's sources and metadata are not kept: they follow
from its parents' and are made when asked for (:meth:`NodeTable.sources_arrow`, for a round's
ids and for the output's rows), which saves a list and a dict per merge during the run.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..mergers.base import MemoryItem, MergePair
from ..store.columns import ArrowView, ColumnView, TenantView, compact_codes, dumps_meta, loads_meta
from ..store.mapped_texts import mapped_column
from ..store.memory_store import MemoryStore

__all__ = ["NodeTable", "gather_rows", "gather_arrow", "leaf_rows", "merged_id"]


_JSON_ESCAPE = r'[\x00-\x1f"\\]'  # what json.dumps(..., ensure_ascii=False) escapes in a string


def _has_meta(meta: pa.Array) -> np.ndarray:
    """Per row: metadata other than null or ``"{}"`` (what :func:`loads_meta` reads as ``{}``).
    Shape: (N,) -> (N,) bool"""
    return pc.fill_null(pc.not_equal(meta, "{}"), False).to_numpy(zero_copy_only=False).astype(bool)


def _order_of(first: np.ndarray) -> np.ndarray:
    """Where each row sits in ``[the rows where first, the others]`` (each part in row order): the
    take that puts such a concatenation back in row order. Shape: (R,) bool -> (R,) int64"""
    order = np.empty(len(first), dtype=np.int64)
    k = int(first.sum())
    order[np.flatnonzero(first)] = np.arange(k)
    order[np.flatnonzero(~first)] = k + np.arange(len(first) - k)
    return order


def gather_rows(rows, n: int, orig: pa.Array, merged: list) -> list:
    """Values of ``rows`` (host int array) of a column over a table's rows: originals (``< n``)
    by one Arrow take of ``orig``, merged rows from the list ``merged``."""
    rows = np.asarray(rows, dtype=np.int64)
    o = rows < n
    out = np.empty(len(rows), dtype=object)
    if o.any():
        out[o] = orig.take(pa.array(rows[o])).to_pylist()
    if (~o).any():
        out[~o] = [merged[j] for j in (rows[~o] - n).tolist()]
    return out.tolist()


def gather_arrow(rows, n: int, orig: pa.Array, merged: list) -> pa.Array:
    """:func:`gather_rows` as one ``large_string`` Arrow array: originals by one take of ``orig``,
    merged rows' values from the list ``merged``, put back in the order of ``rows``.
    Shape: (R,) -> (R,) large_string"""
    rows = np.asarray(rows, dtype=np.int64)
    o = rows < n
    m = pa.array([merged[j] for j in (rows[~o] - n).tolist()], type=pa.large_string())
    return pa.concat_arrays([orig.take(pa.array(rows[o])).cast(pa.large_string()), m]).take(pa.array(_order_of(o)))


_ID_BLOCK = 1 << 15  # merged rows whose sources are read at once for their ids
_TEXT_BLOCK = 1 << 13  # output rows whose texts are gathered at once (to_store): 8,192 merged texts of 4 KB, 32 MB


def leaf_rows(parents: np.ndarray, size: np.ndarray, n: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The originals inside each of ``rows``, in sources order (a merged row's older parent's
    first, recursively), one step per level of the merges with only merged rows expanded.
    ``parents`` (M, 2): the (older, newer) rows of merged row ``n + j``; ``size``: the originals
    inside each row. Shape: rows (R,) -> offsets (R + 1,) int64, leaves (L,) int64 original rows
    (row r's are ``leaves[offsets[r]:offsets[r + 1]]``)"""
    rows = np.asarray(rows, dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(size[rows], out=offsets[1:])
    leaves = np.empty(int(offsets[-1]), dtype=np.int64)
    node, pos = rows, offsets[:-1]
    while len(node):
        o = node < n
        leaves[pos[o]] = node[o]
        node, pos = node[~o], pos[~o]
        a, b = parents[node - n, 0], parents[node - n, 1]
        node, pos = np.concatenate([a, b]), np.concatenate([pos, pos + size[a]])
    return offsets, leaves


def merged_id(sources: list[str]) -> str:
    """Content-addressed id of a merged node: stable across runs and machines."""
    h = hashlib.sha1("\x1f".join(sorted(sources)).encode("utf-8")).hexdigest()[:16]
    return f"mf-{h}"


class _Rows(ColumnView):
    """A column over all rows: the store's view for originals, a Python list for merged rows."""

    def __init__(self, orig: ColumnView, merged: list):
        super().__init__(0)
        self.orig, self.merged = orig, merged

    def __len__(self) -> int:
        return len(self.orig) + len(self.merged)

    def _values(self, lo, hi):
        n = len(self.orig)
        out = self.orig[lo:min(hi, n)] if lo < n else []
        return out + self.merged[max(lo, n) - n:max(hi, n) - n]

    def __getitem__(self, i):
        self._n = len(self)
        return super().__getitem__(i)

    def __iter__(self):
        self._n = len(self)
        return super().__iter__()


class NodeTable:
    """Per-row columns of every node a run has seen (rows are never removed)."""

    def __init__(self, store: MemoryStore, *, map_texts: bool = False):
        self.store = store
        self.n = n = len(store)
        self._cap = max(2 * n, 16)  # merges never exceed n - 1; grows anyway if more rows come
        self._ts = np.empty(self._cap, dtype=np.float64)
        self._ts[:n] = store.timestamps.detach().cpu().numpy()
        self._first = np.arange(self._cap, dtype=np.int64)  # smallest original index inside
        self._code = np.empty(self._cap, dtype=np.int64)
        self._code[:n] = store.tenant_codes_np
        self._parents = np.full((self._cap - n, 2), -1, dtype=np.int64)  # (older, newer) of merged row n + j
        self._rich = np.empty(self._cap, dtype=bool)  # a source inside has metadata (not null or "{}")
        self._rich[:n] = _has_meta(store.metadata.arrow)
        self._size = np.ones(self._cap, dtype=np.int64)  # originals inside each row
        self.m_ids: list[str] = []
        self.m_texts: list[str] = []
        self.ids = _Rows(store.ids, self.m_ids)
        self.texts = _Rows(store.texts, self.m_texts)
        # the originals' Arrow columns, read in place
        self._o_ids, self._o_texts = store.ids.arrow, store.texts.arrow
        self._o_sources, self._o_meta = store.sources.arrow, store.metadata.arrow
        self._map_texts = map_texts  # the output's texts into a mapped spill file (engine/memory.py)

    def __len__(self) -> int:
        return self.n + len(self.m_ids)

    # ---------------------------------------------------------------- columns
    @property
    def ts(self) -> np.ndarray:
        """(rows,) float64 timestamps."""
        return self._ts[:len(self)]

    @property
    def first(self) -> np.ndarray:
        """(rows,) int64 smallest original index inside each row."""
        return self._first[:len(self)]

    @property
    def tenant(self) -> ColumnView:
        """Tenant name of each row."""
        return TenantView(self.store.tenant_table, self._code[:len(self)])

    def tenant_of(self, rows: np.ndarray) -> list[str]:
        names = self.store.tenant_table
        return [names[c] for c in self._code[rows].tolist()]

    def id_of(self, i: int) -> str:
        return self._o_ids[i].as_py() if i < self.n else self.m_ids[i - self.n]

    def ids_of(self, rows: np.ndarray) -> list[str]:
        return gather_rows(rows, self.n, self._o_ids, self.m_ids)

    def texts_of(self, rows: np.ndarray) -> list[str]:
        return gather_rows(rows, self.n, self._o_texts, self.m_texts)

    def sources_arrow(self, rows: np.ndarray) -> pa.Array:
        """The sources of ``rows`` (host int array): each merged row's are its older parent's then
        its newer parent's, down to the originals' own lists (:func:`leaf_rows`), one Arrow take.
        Shape: (R,) -> (R,) large_list<large_string>"""
        offsets, leaves = leaf_rows(self._parents, self._size, self.n, rows)
        taken = self._o_sources.take(pa.array(leaves, type=pa.int64()))  # (L,) each original's list
        ls = pa.large_list(pa.large_string())
        taken = taken.cast(ls) if taken.type != ls else taken
        ends = np.zeros(len(leaves) + 1, dtype=np.int64)
        np.cumsum(pc.list_value_length(taken).to_numpy(zero_copy_only=False), out=ends[1:])
        return pa.LargeListArray.from_arrays(pa.array(ends[offsets], type=pa.int64()), pc.list_flatten(taken))

    def _meta(self, i: int) -> dict:
        """Row ``i``'s metadata: an original's from the store; a merged row's is
        ``{**meta(older), **meta(newer), "merged_from": [id(older), id(newer)]}``, made here
        from the rows below it (iteratively: a chain of merges may be long)."""
        made: dict[int, dict] = {}
        stack = [i]
        while stack:
            r = stack[-1]
            if r < self.n:
                made[r] = loads_meta(self._o_meta[r].as_py())
                stack.pop()
                continue
            a, b = self._parents[r - self.n].tolist()
            todo = [p for p in (a, b) if p not in made]
            if todo:
                stack += todo[::-1]
                continue
            made[r] = {**made.pop(a), **made.pop(b), "merged_from": [self.id_of(a), self.id_of(b)]}
            stack.pop()
        return made[i]

    # ---------------------------------------------------------------- merging
    def order(self, a: int, b: int) -> tuple[int, int]:
        """(older, newer): by timestamp, then by the earliest original inside."""
        return (a, b) if (self._ts[a], self._first[a]) <= (self._ts[b], self._first[b]) else (b, a)

    def order_many(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`order` of many pairs at once (host int arrays)."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        ta, tb = self._ts[a], self._ts[b]
        keep = (ta < tb) | ((ta == tb) & (self._first[a] <= self._first[b]))
        return np.where(keep, a, b), np.where(keep, b, a)

    def merge_pair(self, older: int, newer: int) -> MergePair:
        """The merger's input for two rows (pass them through :meth:`order` first)."""
        return self.merge_pairs(np.array([older]), np.array([newer]))[0]

    def merge_pairs(self, older: np.ndarray, newer: np.ndarray) -> list[MergePair]:
        """The merger's inputs for many (older, newer) rows, gathered a column at a time."""
        ia, ib = self.ids_of(older), self.ids_of(newer)
        xa, xb = self.texts_of(older), self.texts_of(newer)
        ta, tb = self._ts[older].tolist(), self._ts[newer].tolist()
        ten = self.tenant_of(np.asarray(older, dtype=np.int64))
        return [MergePair(MemoryItem(ia[k], xa[k], ta[k]), MemoryItem(ib[k], xb[k], tb[k]), ten[k])
                for k in range(len(ia))]

    def add(self, older: int, newer: int, text: str) -> int:
        """Append the merged node of two rows with the merger's ``text``; returns its row."""
        return int(self.add_many(np.array([older]), np.array([newer]), [text])[0])

    def add_many(self, older: np.ndarray, newer: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """Append the merged nodes of (older, newer) rows (host int arrays, rows already in the
        table, each at most once) with the merger's ``texts``. Shape: (P,) -> (P,) int64 rows"""
        older, newer = np.asarray(older, dtype=np.int64), np.asarray(newer, dtype=np.int64)
        j0, P = len(self), len(older)
        if len(newer) != P or len(texts) != P:
            raise ValueError(f"add_many needs as many newer rows and texts as older rows ({P}), "
                             f"got {len(newer)} and {len(texts)}")
        if P and max(int(older.max()), int(newer.max())) >= j0:
            raise ValueError(f"add_many merges rows already in the table (< {j0}), got row "
                             f"{max(int(older.max()), int(newer.max()))}")
        while j0 + P > self._cap:
            self._grow()
        rows = j0 + np.arange(P, dtype=np.int64)
        self._ts[rows] = np.maximum(self._ts[older], self._ts[newer])
        self._code[rows] = self._code[older]
        self._parents[rows - self.n, 0], self._parents[rows - self.n, 1] = older, newer
        self._rich[rows] = self._rich[older] | self._rich[newer]
        self._first[rows] = np.minimum(self._first[older], self._first[newer])
        self._size[rows] = self._size[older] + self._size[newer]
        ids: list[str] = []
        for c0 in range(0, P, _ID_BLOCK):  # ids from the sources, a block of rows at a time
            ids += [merged_id(src) for src in self.sources_arrow(rows[c0:c0 + _ID_BLOCK]).to_pylist()]
        self.m_ids.extend(ids)  # the rows exist from here on
        self.m_texts.extend(texts)
        return rows

    def _grow(self) -> None:
        cap = 2 * self._cap
        for name in ("_ts", "_code", "_rich", "_size"):
            a = np.empty(cap, dtype=getattr(self, name).dtype)
            a[:self._cap] = getattr(self, name)
            setattr(self, name, a)
        f = np.arange(cap, dtype=np.int64)
        f[:self._cap] = self._first
        p = np.full((cap - self.n, 2), -1, dtype=np.int64)
        p[:self._cap - self.n] = self._parents
        self._first, self._parents, self._cap = f, p, cap

    # ---------------------------------------------------------------- output
    def output_order(self, live: Sequence[int] | np.ndarray) -> np.ndarray:
        """``live`` rows in output order (earliest original inside; stable)."""
        live = np.asarray(live, dtype=np.int64)
        return live[np.argsort(self._first[live], kind="stable")]

    def _merged_meta(self, m: np.ndarray, m_id: list[str]) -> pa.Array:
        """The metadata JSON of merged rows ``n + m`` (:meth:`_meta`, written by ``json.dumps``).
        A row with no metadata below it is ``{"merged_from": [older id, newer id]}``: written for
        all such rows at once by Arrow from the parents' ids when neither needs a JSON escape; every
        other row as :meth:`_meta` makes it. Shape: m (M,) -> (M,) large_string"""
        plain = ~self._rich[self.n + m]
        par = self._parents[m[plain]]
        ids = [self.ids_arrow(par[:, 0]), self.ids_arrow(par[:, 1])]
        esc = np.zeros(len(par), dtype=bool)  # a parent's id json would escape: that row by json
        for a in ids:
            esc |= pc.match_substring_regex(a, _JSON_ESCAPE).to_numpy(zero_copy_only=False).astype(bool)
        if esc.any():
            plain[np.flatnonzero(plain)[esc]] = False
            ids = [a.filter(pa.array(~esc)) for a in ids]
        lit = [pa.scalar(x, type=pa.large_string()) for x in ('{"merged_from": ["', '", "', '"]}', "")]
        fast = pc.binary_join_element_wise(lit[0], ids[0], lit[1], ids[1], lit[2], lit[3])
        slow = pa.array([dumps_meta(self._meta(self.n + j), m_id[k]) for k, j in
                         zip(np.flatnonzero(~plain).tolist(), m[~plain].tolist())], type=pa.large_string())
        return pa.concat_arrays([fast, slow]).take(pa.array(_order_of(plain)))

    def ids_arrow(self, rows: np.ndarray) -> pa.Array:
        """The ids of ``rows`` (host int array) as one Arrow array.
        Shape: (R,) -> (R,) large_string"""
        return gather_arrow(rows, self.n, self._o_ids, self.m_ids)

    def _text_blocks(self, rows: np.ndarray):
        """The texts of ``rows`` (host int array) in their order, :data:`_TEXT_BLOCK` rows at a
        time. Shape: (R,) -> yields (B,) large_string"""
        for lo in range(0, len(rows), _TEXT_BLOCK):
            yield gather_arrow(rows[lo:lo + _TEXT_BLOCK], self.n, self._o_texts, self.m_texts)

    def to_store(self, rows: np.ndarray, embeddings: torch.Tensor) -> MemoryStore:
        """The store of ``rows`` (already in output order); ``embeddings`` (len(rows), D) match
        them. Originals are taken from the store's Arrow columns, merged rows appended, then
        one take puts every column in output order; from the mapped-texts bound the texts go a
        block at a time into a mapped spill file (:func:`.mapped_texts.mapped_column`)."""

        rows = np.asarray(rows, dtype=np.int64)
        is_o = rows < self.n
        o_rows, m_rows = rows[is_o], (rows[~is_o] - self.n).tolist()
        po, pp = pa.array(o_rows, type=pa.int64()), pa.array(_order_of(is_o))  # pp: output order
        st = self.store
        m_id = [self.m_ids[j] for j in m_rows]

        def col(orig, merged, typ):
            return pa.concat_arrays([orig.take(po), pa.array(merged, type=typ)]).take(pp)

        ids = col(st.ids.arrow, m_id, pa.large_string())
        if self._map_texts:  # a block at a time into a mapped spill file
            texts = mapped_column(self._text_blocks(rows))
        else:
            texts = col(st.texts.arrow, [self.m_texts[j] for j in m_rows], pa.large_string())
        sources = self.sources_arrow(rows)  # already in output order: originals' lists and merged rows'
        meta = pa.concat_arrays([st.metadata.arrow.take(po), self._merged_meta(np.asarray(m_rows, dtype=np.int64),
                                                                               m_id)]).take(pp)
        names, codes = compact_codes(st.tenant_table, self._code[rows])
        ts = torch.as_tensor(self._ts[rows], dtype=torch.float64).to(embeddings.device)
        return MemoryStore(ids, texts, embeddings, ts, TenantView(names, codes), sources, ArrowView(meta),
                           st.embedder)

