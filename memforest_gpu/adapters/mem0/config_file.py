"""Reading a Mem0 config file (YAML or JSON) and checking its shape before Mem0 sees it: each
problem is one ``ValueError`` line naming the file, the line (for a file that does not parse)
or the field (``vector_store.config.port``), never a YAML, JSON or HTTP library's traceback."""
from __future__ import annotations

import os

from ...jsonfile import loads_json
from ...runs.errors import OptionError

__all__ = ["load_config", "check_config"]

SECTIONS = ("vector_store", "embedder", "llm", "graph_store", "reranker")  # Mem0's provider sections


def _kind(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _shown(value) -> str:
    r = repr(value)
    return f"{_kind(value)} {r if len(r) <= 60 else r[:57] + '...'}"


def _parse(path: str, text: str):
    if path.endswith(".json"):
        return loads_json(text, path, "a Mem0 config in JSON")
    try:
        import yaml
    except ImportError:
        raise ImportError("reading a YAML config needs pyyaml: pip install 'memforest-gpu[mem0]'") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        context = getattr(e, "context", None) or ""
        what = " ".join(f"{context if context.startswith('expected') else ''} "
                        f"{getattr(e, 'problem', None) or e}".split())
        if isinstance(e, yaml.constructor.ConstructorError):
            what += " (tags that build Python objects are refused)"
        raise ValueError(f"{path} must be a Mem0 config in YAML, got {what}{where}") from None
    except RecursionError:
        raise ValueError(f"{path} must be a Mem0 config in YAML, got nesting too deep to read") from None


def load_config(path: str | os.PathLike) -> dict:
    """Mem0's config dict from YAML or JSON (optionally under a top-level ``mem0:`` key),
    checked by :func:`check_config`."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Mem0 config not found: {path!r}")
    if os.path.isdir(path):
        raise OptionError(f"{{config}} must be a Mem0 config file (YAML or JSON), got the folder {path!r}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} must be UTF-8 text, got a byte that is not ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise OptionError(f"{{config}} must be a readable file, cannot read {path!r}: {e.strerror or e}") from None
    cfg = _parse(path, text)
    if isinstance(cfg, dict) and isinstance(cfg.get("mem0"), dict):
        cfg = cfg["mem0"]
    if not isinstance(cfg, dict) or "vector_store" not in cfg:
        raise ValueError(f"{path}: Mem0 config must be a mapping with a 'vector_store' section, got "
                         f"{sorted(map(str, cfg)) if isinstance(cfg, dict) else _shown(cfg)}")
    check_config(cfg, path)
    return cfg


def check_config(cfg: dict, where: str = "Mem0 config") -> None:
    """The shape Mem0's provider sections must have: each a mapping, its ``provider`` a
    string and its ``config`` a mapping; a server's ``port`` an integer in [1, 65535] and
    its ``host`` a string."""
    for name in SECTIONS:
        if name not in cfg or (cfg[name] is None and name != "vector_store"):
            continue
        sec = cfg[name]
        if not isinstance(sec, dict):
            raise ValueError(f"{where}: {name} must be a mapping with provider and config, got {_shown(sec)}")
        if "provider" in sec and not isinstance(sec["provider"], str):
            raise ValueError(f"{where}: {name}.provider must be a string, got {_shown(sec['provider'])}")
        c = sec.get("config")
        if c is None:
            continue
        if not isinstance(c, dict):
            raise ValueError(f"{where}: {name}.config must be a mapping, got {_shown(c)}")
        if "port" in c and c["port"] is not None:
            p = c["port"]
            ok = (isinstance(p, int) and not isinstance(p, bool)) or (isinstance(p, str) and p.strip().isdigit())
            if not ok or not 1 <= int(p) <= 65535:
                raise ValueError(f"{where}: {name}.config.port must be an integer port in [1, 65535], got "
                                 f"{_shown(p)}")
        if "host" in c and c["host"] is not None and not isinstance(c["host"], str):
            raise ValueError(f"{where}: {name}.config.host must be a string, got {_shown(c['host'])}")
