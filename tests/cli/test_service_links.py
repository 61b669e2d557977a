"""A Service named unwind-webhook gives every pod of its namespace
UNWIND_WEBHOOK_PORT=tcp://10.0.0.91:443 (Kubernetes' service links), which is also the
operator's own setting: seen on the node, where the operator then crashed at start-up
before parsing anything. The chart turns service links off; the CLI still starts."""

from __future__ import annotations

import pytest

from unwind.cli.main import main


def test_a_service_link_variable_does_not_break_other_commands(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("UNWIND_WEBHOOK_PORT", "tcp://10.0.0.91:443")
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0


def test_the_operator_names_the_flag_a_bad_port_came_from(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("UNWIND_WEBHOOK_PORT", "tcp://10.0.0.91:443")
    with pytest.raises(SystemExit) as done:
        main(["operator"])
    assert done.value.code == 2
    assert "--webhook-port: invalid int value: 'tcp://10.0.0.91:443'" in capsys.readouterr().err
