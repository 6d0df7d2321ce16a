"""The extras helper: a missing import skips on a dev machine and fails in CI."""
import pytest
from _pytest.outcomes import Failed, Skipped
from extras import extras_required, need, skip_or_fail


@pytest.mark.parametrize("env, required", [({}, False), ({"CI": "true"}, True), ({"CI": "false"}, False),
                                           ({"MEMFOREST_REQUIRE_EXTRAS": "1"}, True),
                                           ({"MEMFOREST_REQUIRE_EXTRAS": "0", "CI": "true"}, False)])
def test_missing_import_skips_or_fails(monkeypatch, env, required):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("MEMFOREST_REQUIRE_EXTRAS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert extras_required() is required
    with pytest.raises(ImportError if required else Skipped):
        need("memforest_no_such_module")
    with pytest.raises(Failed if required else Skipped, match="no README section"):
        skip_or_fail("no README section")
    assert need("json").dumps([1]) == "[1]"
