"""Pure parts of the gateway: the report header, secrets, URL placeholders, ULIDs as ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from unwind.gateway.rest import check_entry_id, choose_run, report_header
from unwind.upstream.client import fill_url
from unwind.upstream.errors import Refusal
from unwind.upstream.secrets import LocalSecrets, SecretMissing, env_name


def test_the_report_header_is_compact_json_with_non_ascii_escaped() -> None:
    assert report_header({"tool": "t", "undo": {"arguments": {"repo": "café/ü"}}}) == \
        '{"tool":"t","undo":{"arguments":{"repo":"caf\\u00e9/\\u00fc"}}}'


def test_a_secret_is_read_from_the_folder_first_then_the_environment(tmp_path: Path) -> None:
    (tmp_path / "api-token").mkdir()
    (tmp_path / "api-token" / "token").write_text("from-file\n")
    env = {env_name("api-token", "token"): "from-env", env_name("other", "key.pem"): "pem"}
    secrets = LocalSecrets(tmp_path, env)
    assert env_name("other", "key.pem") == "UNWIND_SECRET_OTHER_KEY_PEM"
    assert secrets.get("api-token", "token") == "from-file"
    assert secrets.get("other", "key.pem") == "pem"
    with pytest.raises(SecretMissing, match="UNWIND_SECRET_NOWHERE_X"):
        secrets.get("nowhere", "x")
    with pytest.raises(SecretMissing):
        LocalSecrets(tmp_path, {}).get("..", "token")  # never a path outside the folder


def test_url_placeholders_are_filled_url_encoded_or_refused() -> None:
    assert fill_url("http://h/repos/{{args.repo}}/n/{{ args.n }}", {"repo": "o/r x", "n": 7}) == \
        "http://h/repos/o%2Fr%20x/n/7"
    with pytest.raises(Refusal, match="needs argument 'repo'"):
        fill_url("http://h/{{args.repo}}", {})
    with pytest.raises(Refusal, match="string, number or bool"):
        fill_url("http://h/{{args.repo}}", {"repo": {"a": 1}})


def test_a_run_and_an_entry_id_are_checked_before_they_name_files() -> None:
    assert choose_run(None, "run-1") == "run-1"
    for bad in ("../etc", "Run", "a.b", "-a", "x" * 64):
        with pytest.raises(Refusal, match="X-Unwind-Run"):
            choose_run(bad, None)
    with pytest.raises(Refusal, match="send the X-Unwind-Run header"):
        choose_run(None, None)
    assert len(check_entry_id(None)) == 26
    with pytest.raises(Refusal, match="Idempotency-Key"):
        check_entry_id("a/b")
