"""The conformance suite holds providers to the contract: an in-memory provider
that keeps it passes, and each broken one fails the tests for what it breaks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tensorstream

pytest_plugins = ["pytester"]

#: The test classes of the pytester project, one per provider of mem_providers.py.
_PROJECT = '''
import pytest
import mem_providers as m
from tensorstream.testing.conformance import ProviderConformance


class TestKeepsTheContract(ProviderConformance):
    @pytest.fixture
    def target(self):
        return m.target_for("memok", m.MemProvider)


class TestIgnoresPin(ProviderConformance):
    @pytest.fixture
    def target(self):
        return m.target_for("memnopin", m.IgnoresPin)


class TestStallsBlocking(ProviderConformance):
    @pytest.fixture
    def target(self):
        return m.target_for("memstall", m.StallsBlocking)


class TestMisreports(ProviderConformance):
    @pytest.fixture
    def target(self):
        return m.target_for("memliar", m.Misreports)


class TestLiesAboutReceived(ProviderConformance):
    @pytest.fixture
    def target(self):
        return m.target_for("memcount", m.LiesAboutReceived)
'''


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *,
         project: str = _PROJECT, ini: str = "asyncio_mode = auto\n",
         ) -> dict[str, dict[str, str]]:
    """``{class: {test: outcome}}`` of one run of the suite on every provider
    (in a subprocess: the deadline tests need their own event loops)."""
    # The tensorstream under test, wherever it was imported from.
    src = str(Path(tensorstream.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [src, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    pytester.makeini("[pytest]\n" + ini + "asyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(mem_providers=Path(__file__).with_name("mem_providers.py").read_text())
    pytester.makepyfile(test_suite=project)
    # Native tracebacks: pytest's own formatter has crashed (INTERNALERROR) on a
    # traceback entry without a line number, which ended the run early.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly",
                                           "-rA", "-q", "--tb=native", "--timeout=120")
    found: dict[str, dict[str, str]] = {}
    for line in result.outlines:
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "SKIPPED", "ERROR") and "::" in rest:
            node = rest.split(" ", 1)[0]
            _, cls, test = node.split("::", 2)
            found.setdefault(cls, {})[test] = word
    assert found, "\n".join(result.outlines[-40:] + result.errlines[-40:])
    return found


def test_the_suite_passes_a_provider_that_keeps_the_contract_and_fails_broken_ones(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _run(pytester, monkeypatch)

    def failed(cls: str) -> set[str]:
        return {t for t, o in results[cls].items() if o in ("FAILED", "ERROR")}

    assert failed("TestKeepsTheContract") == set(), results["TestKeepsTheContract"]
    # The fault tests really ran for the provider that keeps the contract.
    ran = {t for t, o in results["TestKeepsTheContract"].items() if o == "PASSED"}
    assert {"test_object_replaced_between_reads_is_never_mixed",
            "test_object_replaced_mid_body_is_never_mixed",
            "test_broken_body_reports_received_and_is_resumed",
            "test_a_trickle_is_cut_at_the_total_deadline[blocking]",
            "test_a_stall_is_cut_at_the_idle_timeout[blocking]"} <= ran

    assert {"test_object_replaced_between_reads_is_never_mixed",
            "test_object_replaced_mid_body_is_never_mixed",
            "test_open_file_is_pinned_to_one_version"} <= failed("TestIgnoresPin")
    assert {"test_a_trickle_is_cut_at_the_total_deadline[blocking]",
            "test_a_stall_is_cut_at_the_idle_timeout[blocking]"} <= failed("TestStallsBlocking")
    assert "test_list_and_delete" in failed("TestMisreports")
    assert "test_broken_body_reports_received_and_is_resumed" in failed("TestLiesAboutReceived")
    # Each broken provider fails only for what it breaks.
    assert failed("TestStallsBlocking") <= {
        "test_a_trickle_is_cut_at_the_total_deadline[blocking]",
        "test_a_stall_is_cut_at_the_idle_timeout[blocking]"}
    assert failed("TestLiesAboutReceived") == {
        "test_broken_body_reports_received_and_is_resumed"}


def test_the_suite_runs_under_pytest_asyncios_default_strict_mode(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # A provider author who runs the suite as docs/providers.md shows, without
    # asyncio_mode = auto, used to get every async test failing ("async def
    # functions are not natively supported") for a provider that keeps the contract.
    project = _PROJECT.split("class TestIgnoresPin")[0]
    results = _run(pytester, monkeypatch, project=project, ini="")["TestKeepsTheContract"]
    assert "FAILED" not in results.values() and "ERROR" not in results.values(), results
    assert results["test_stat_reports_size"] == "PASSED"
    assert results["test_object_replaced_between_reads_is_never_mixed"] == "PASSED"
