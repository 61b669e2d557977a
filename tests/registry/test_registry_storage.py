"""The folder storage: file names for tool names, atomic writes, immutable versions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unwind.registry import FolderStorage, Registry, RegistryError, escape_tool

TOOL_CHARS = st.text(alphabet="abcXYZ019_-./:", min_size=1, max_size=20)


@pytest.mark.parametrize(("tool", "escaped"), [
    ("stripe.create_charge", "stripe%2Ecreate_charge"),
    ("github/issues:create", "github%2Fissues%3Acreate"),
    ("..", "%2E%2E"),
    ("a-b_C9", "a-b_C9"),
])
def test_tool_names_are_escaped_into_safe_file_names(tool: str, escaped: str) -> None:
    assert escape_tool(tool) == escaped


@given(TOOL_CHARS, TOOL_CHARS)
def test_escaping_is_one_to_one_and_never_makes_a_path(a: str, b: str) -> None:
    assert re.fullmatch(r"[A-Za-z0-9_%-]+", escape_tool(a))
    assert escape_tool(a) not in (".", "..")
    assert (escape_tool(a) == escape_tool(b)) == (a == b)


def test_a_write_leaves_no_temporary_files_and_writes_the_index_last(tmp_path: Path) -> None:
    storage = FolderStorage(tmp_path / "reg")
    Registry(storage).publish([{"tool": "x/y", "effect": "read_only", "permission": "p"}], by="a")
    files = sorted(str(p.relative_to(tmp_path / "reg")) for p in (tmp_path / "reg").rglob("*")
                   if p.is_file())
    assert files == [".lock", "index.json", "tools/x%2Fy/v1.json"]  # .lock: the index writers' lock
    assert (tmp_path / "reg" / "tools" / "x%2Fy" / "v1.json").stat().st_mode & 0o044 == 0o044


def test_an_existing_version_is_never_overwritten(tmp_path: Path) -> None:
    storage = FolderStorage(tmp_path)
    storage.write_version("a", 1, {"first": True})
    with pytest.raises(RegistryError) as err:
        storage.write_version("a", 1, {"second": True})
    assert err.value.code == "conflict"
    assert storage.read_version("a", 1) == {"first": True}


def test_an_unparsable_version_file_is_reported_as_tampered(tmp_path: Path) -> None:
    storage = FolderStorage(tmp_path)
    Registry(storage).publish([{"tool": "a", "effect": "read_only", "permission": "p"}],
                              by="a", status="approved")
    Path(storage.location("a", 1)).write_text("{not json")
    with pytest.raises(RegistryError) as err:
        Registry(storage).load()
    assert err.value.code == "tampered" and "a v1" in err.value.message


def test_concurrent_publishes_of_different_tools_all_reach_the_index(tmp_path: Path) -> None:
    import threading

    def publish(i: int) -> None:
        Registry(FolderStorage(tmp_path / "reg")).publish(
            [{"tool": f"t{i}", "effect": "read_only", "permission": "p"}], by="a")

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(Registry(FolderStorage(tmp_path / "reg")).list()) == 16
