"""What users of kubectl, helm and kyverno expect of a CLI: stdin, --version, usage that
helps, scaffolding, a schema for the resource form, plain text off a terminal, pre-commit."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from unwind import __version__
from unwind.cli.output import paint

from .conftest import REPO, Run, run_process


def test_a_dash_reads_the_manifests_from_standard_input(tmp_path: Path) -> None:
    rendered = (REPO / "manifests" / "payments.yaml").read_text()
    done = run_process("validate", "-", stdin=rendered, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: 3 tool manifests valid in namespace payments")
    no_owner = rendered.replace("  owner: [payments-team@example.com]\n", "")
    done = run_process("lint", "--strict", "-", stdin=no_owner, cwd=tmp_path)
    assert done.returncode == 1 and "<stdin>:" in done.stdout and "L011" in done.stdout
    done = run_process("validate", "-", stdin="tool: a\neffect: [x\n", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("error: <stdin>:")


def test_version_prints_the_version(unwind: Run) -> None:
    assert unwind("--version") == (0, f"unwind {__version__}\n", "")


def test_an_unknown_option_shows_the_usage_of_the_command_it_was_given_to(unwind: Run) -> None:
    code, out, err = unwind("lint", "--stirct", "manifests")
    assert (code, out) == (2, "")
    assert err.startswith("usage: unwind lint ")
    assert err.rstrip().endswith("unwind lint: error: unrecognized arguments: --stirct")
    code, _, err = unwind("manifests", "publish", "x", "--by")
    assert code == 2 and err.startswith("usage: unwind manifests publish ")


def test_a_misspelled_command_gets_a_suggestion(unwind: Run) -> None:
    code, _, err = unwind("valdate", "manifests")
    assert code == 2 and "did you mean 'validate'?" in err


def test_init_writes_a_manifest_and_a_test_that_pass_every_check(project: Path, unwind: Run) -> None:
    code, out, _ = unwind("init", "billing.create_invoice", "--effect", "compensable", "-n", "billing")
    assert code == 0 and "wrote manifests/billing.create-invoice.yaml" in out
    assert unwind("validate", "manifests")[0] == 0
    code, out, err = unwind("lint", "--strict", "manifests")
    assert code == 0, out + err
    code, out, err = unwind("test", "tests/contracts", "-m", "manifests")
    assert code == 0, out + err
    assert "not covered" not in out
    code, _, err = unwind("init", "billing.create_invoice")
    assert code == 1 and "already exists: not overwriting it" in err


@pytest.mark.parametrize("effect", ["read_only", "idempotent", "reversible", "compensable", "irreversible"])
def test_init_of_every_effect_passes_every_check_too(project: Path, unwind: Run, effect: str) -> None:
    assert unwind("init", "crm.get_contact", "--effect", effect)[0] == 0
    text = (project / "manifests" / "crm.get-contact.yaml").read_text()
    assert f"  effect: {effect}\n" in text
    for argv in (["validate", "manifests"], ["lint", "--strict", "manifests"],
                 ["test", "tests/contracts", "-m", "manifests"]):
        code, out, err = unwind(*argv)
        assert code == 0, (argv, out, err)
        assert "not covered" not in out


def test_init_offers_every_effect_a_manifest_can_declare(unwind: Run) -> None:
    from unwind.cli.scaffold import EFFECTS
    from unwind.manifest.model import Effect

    assert set(EFFECTS) == {e.value for e in Effect}
    code, out, _ = unwind("init", "--help")
    assert code == 0 and "reversible" in out and "irreversible" in out


def test_the_resource_schema_accepts_the_examples_and_refuses_a_typo(unwind: Run) -> None:
    code, out, _ = unwind("schema", "--resource")
    schema = json.loads(out)
    validator = jsonschema.Draft202012Validator(schema)
    docs = [d for d in yaml.safe_load_all((REPO / "manifests" / "payments.yaml").read_text())]
    assert code == 0 and docs and all(not list(validator.iter_errors(d)) for d in docs)
    bad = {**docs[0], "kind": "ToolManifst"}
    assert list(validator.iter_errors(bad))
    typo = {**docs[0], "spec": {**docs[0]["spec"], "efect": "read_only"}}
    assert list(validator.iter_errors(typo))


def test_colour_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert paint("ok:", "green", Tty()) == "\033[32mok:\033[0m"
    assert paint("ok:", "green", io.StringIO()) == "ok:"
    monkeypatch.setenv("NO_COLOR", "1")
    assert paint("ok:", "green", Tty()) == "ok:"


def test_output_through_a_pipe_has_no_colour_codes(tmp_path: Path) -> None:
    done = run_process("validate", str(REPO / "manifests"), cwd=tmp_path)
    assert done.returncode == 0 and "\033[" not in done.stdout + done.stderr


def test_the_pre_commit_hooks_run_the_documented_checks() -> None:
    hooks = {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"unwind-validate", "unwind-lint", "unwind-test"}
    assert all(h["language"] == "python" and h["pass_filenames"] is False for h in hooks.values())
    assert [hooks["unwind-lint"]["entry"], *hooks["unwind-lint"]["args"]] == [
        "unwind lint --strict", "manifests/"]


# ---- rename and remove keep the contract tests in step (issue 12, item 1) ------------------

@pytest.fixture
def examples(project: Path) -> Path:
    shutil.copytree(REPO / "manifests", project / "manifests")
    shutil.copytree(REPO / "tests" / "contracts", project / "tests" / "contracts")
    return project


def test_after_a_rename_the_contract_tests_still_pass(examples: Path, unwind: Run) -> None:
    code, out, err = unwind("manifests", "rename", "stripe.refund", "stripe.refund_charge")
    assert code == 0, err
    assert "stripe.refund_charge" in (examples / "tests" / "contracts" / "payments.test.yaml").read_text()
    code, out, err = unwind("test", "tests/contracts", "-m", "manifests")
    assert code == 0, out + err
    assert "stripe.refund" not in out.replace("stripe.refund_charge", "")


def test_after_a_remove_no_case_calls_the_removed_tool(examples: Path, unwind: Run) -> None:
    code, out, err = unwind("manifests", "remove", "stripe.create_charge")
    assert code == 0, err
    assert "stripe.create_charge" not in (examples / "tests" / "contracts" / "payments.test.yaml").read_text()
    code, out, err = unwind("test", "tests/contracts", "-m", "manifests")
    assert code == 0, out + err


def test_the_bash_completion_completes_commands_subcommands_and_options(tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    script = run_process("completion", "bash", cwd=tmp_path)
    assert script.returncode == 0
    (tmp_path / "unwind.bash").write_text(script.stdout)

    def complete(*words: str) -> list[str]:
        probe = (f"source {tmp_path / 'unwind.bash'}; COMP_WORDS=(unwind {' '.join(words)}); "
                 f"COMP_CWORD={len(words)}; _unwind; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
        return done.stdout.split()

    assert complete("vali") == ["validate"]
    assert complete("manifests", "pub") == ["publish"]
    assert complete("dev", "u") == ["up"]
    assert "--allow-empty" in complete("lint", "--al")
    assert complete("manifests", "publish", "--sta") == ["--status"]
