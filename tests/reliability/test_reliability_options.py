"""Reliability: nonsense options are refused where they are parsed (issue 15, class 8).

Every built-in option is checked in one place (:func:`tensorstream.config.validate_options`)
before any provider or request sees it; the error is a ``ConfigurationError`` that names
the option. The tests go through the public doors (``open``, ``deserialize``, the CLI) on a
real file and a real HTTP server, so a value that slipped through would fail later with an
unrelated error (or hang) instead."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorstream
from tensorstream import errors
from tensorstream.cli.main import main as cli_main
from tensorstream.config import VALIDATORS, validate_options
from tensorstream.testing.http_server import HTTPTestServer

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.timeout(120)]

BAD: list[tuple[str, Any]] = [
    ("timeout_idle", 0), ("timeout_idle", -1), ("timeout_idle", "abc"), ("timeout_idle", float("nan")),
    ("timeout_idle", float("inf")), ("timeout_idle", True), ("timeout_connect", 0),
    ("timeout_connect", "-3"), ("timeout_total", 0), ("timeout_total", -0.5),
    ("retries", 0), ("retries", -1), ("retries", 2.5), ("retries", "many"), ("retries", True),
    ("retries", 10**9), ("backoff_initial", -1), ("backoff_max", "x"),
    ("part_size", 0), ("part_size", -4096), ("part_size", 1.5), ("part_size", 2**80),
    ("min_part_size", 0), ("concurrency", 0), ("concurrency", 10**9), ("concurrency", False),
    ("readahead", -1), ("large_read", -1), ("stream_reads", "maybe"), ("stream_reads", 2),
    ("insecure", "perhaps"), ("anonymous", "sure"), ("allow_private_redirects", "?"),
    ("redis_db", -1), ("redis_db", "one"), ("redis_chunk_size", 0), ("redis_cluster", "x"),
    ("s3_addressing_style", "sideways"), ("headers", "X-A: b"), ("headers", {"X A": "b"}),
    ("headers", {"X-A": "b\r\nX-Injected: 1"}), ("token", "a\nb"), ("token", 12345),
    ("ca_bundle", "/nonexistent/ca.pem"), ("ca_bundle", "/dev/null"),
    ("client_cert", "/dev/zero"), ("s3_config_path", "/nonexistent"),
]


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v!r}"[:40] for n, v in BAD])
def test_nonsense_option_is_refused_at_open_naming_the_option(
        tmp_path: Path, name: str, value: Any) -> None:
    path = tmp_path / "obj.bin"
    path.write_bytes(b"x" * 100)
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.open(str(path), **{name: value})
    assert name in str(info.value)
    assert isinstance(info.value, ValueError)


def test_header_and_token_values_are_never_echoed(tmp_path: Path) -> None:
    path = tmp_path / "obj.bin"
    path.write_bytes(b"x")
    secret = "sekrit-hdr-value-9f2"
    for opts in ({"headers": {"Authorization": f"Bearer {secret}\r\nX: y"}},
                 {"token": f"{secret}\n"}):
        with pytest.raises(errors.ConfigurationError) as info:
            tensorstream.open(str(path), **opts)
        assert secret not in str(info.value) and secret not in repr(info.value)


def test_validated_values_reach_the_provider_normalised(http_server: HTTPTestServer) -> None:
    http_server.put("opt.bin", b"y" * 1000)
    with tensorstream.open(http_server.url("opt.bin"), timeout_idle="5", retries="2",
                           part_size="256", stream_reads="false", concurrency=2.0) as f:
        cfg = f._provider.config
        assert (cfg.timeouts.idle, cfg.retry.attempts, cfg.transfer.part_size) == (5.0, 2, 256)
        assert cfg.transfer.stream_reads is False and cfg.transfer.concurrency == 2
        assert f.read() == b"y" * 1000


@pytest.mark.parametrize("kwargs", [{"num_readers": 0}, {"num_readers": -2},
                                    {"num_readers": "two"}, {"verify_hash": "false"},
                                    {"lazy_load": "maybe"}, {"timeout_idle": 0}])
def test_deserialize_options_are_checked_before_opening(tmp_path: Path,
                                                        kwargs: dict[str, Any]) -> None:
    pytest.importorskip("tensorizer")
    path = tmp_path / "m.tensors"
    path.write_bytes(b"not read")  # would fail differently if it were opened
    if kwargs == {"verify_hash": "false"}:
        checked = validate_options(kwargs)  # a string "false" is False, never truthy
        assert checked["verify_hash"] is False
        return
    with pytest.raises(errors.ConfigurationError) as info:
        tensorstream.deserialize(str(path), device="cpu", **kwargs)
    assert next(iter(kwargs)) in str(info.value)


@pytest.mark.parametrize("flag,value", [("--timeout-idle", "0"), ("--timeout-idle", "-1"),
                                        ("--timeout-connect", "nan"), ("--retries", "0")])
def test_cli_refuses_nonsense_options_with_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"z" * 10)
    code = cli_main(["cp", flag, value, str(src), str(tmp_path / "b.bin")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert flag.lstrip("-").replace("-", "_") in err
    assert not (tmp_path / "b.bin").exists()


@pytest.mark.parametrize("header", ["Authorization=Bearer {s}", "Authorization Bearer {s}",
                                    "X-Api-Key: {s}\r\nX-Evil: 1", ": {s}"])
def test_cli_mistyped_header_is_not_echoed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           header: str) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"z")
    secret = "hdr-canary-4e1b7"
    code = cli_main(["cp", "--header", header.format(s=secret), str(src),
                     str(tmp_path / "b.bin")])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "header" in captured.err
    assert secret not in captured.out + captured.err


_numeric = [n for n in VALIDATORS if n in {"timeout_idle", "timeout_connect", "timeout_total",
                                          "retries", "part_size", "concurrency", "readahead",
                                          "redis_db", "backoff_max", "num_readers"}]


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(_numeric),
       value=st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                       st.text(max_size=8), st.booleans(), st.none()))
def test_every_numeric_option_is_in_bounds_or_refused_by_name(name: str, value: Any) -> None:
    try:
        out = validate_options({name: value})[name]
    except errors.ConfigurationError as exc:
        assert name in str(exc)
        return
    if value is None:
        assert out is None
        return
    assert not isinstance(value, bool)
    assert isinstance(out, int | float) and out == out  # a real number, not NaN
    assert out >= 0 and out < 2**63
    if name in ("timeout_idle", "timeout_connect", "timeout_total", "retries", "part_size",
                "concurrency", "num_readers"):
        assert out > 0
    assert os.environ is not None


@pytest.mark.parametrize("kwargs", [{"num_readers": 0}, {"verify_hash": "sometimes"},
                                    {"vllm_tensorized": "?"},
                                    {"stream_kwargs": {"timeout_idle": -1}},
                                    {"deserialization_kwargs": {"lazy_load": "maybe"}}])
def test_tensorizer_config_is_checked_where_it_is_made(kwargs: dict[str, Any]) -> None:
    pytest.importorskip("tensorizer")
    from tensorstream.tensorizer.config import TensorizerConfig

    with pytest.raises(errors.ConfigurationError) as info:
        TensorizerConfig(tensorizer_uri="s3://bucket/model.tensors", **kwargs)
    inner = next(iter(kwargs.values()))
    name = next(iter(inner)) if isinstance(inner, dict) else next(iter(kwargs))
    assert name in str(info.value)
    ok = TensorizerConfig(tensorizer_uri="s3://b/m.tensors", verify_hash="false", num_readers="4")
    assert ok.verify_hash is False and ok.num_readers == 4


@pytest.mark.parametrize("value", ["1e3", "-1", "10XB", "0", "", "1P", "nan", "5.1GiB",
                                   "99999999999999T"])
def test_cli_part_size_out_of_range_is_one_usage_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    """A part size that is not a size, or past 5 GiB (S3's largest part; past the address
    space it failed inside mmap with 'Python int too large to convert to C ssize_t')."""
    src = tmp_path / "a.bin"
    src.write_bytes(b"z" * 10)
    code = cli_main(["cp", "--part-size", value, str(src), str(tmp_path / "b.bin")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "tensorstream cp: error: argument --part-size" in err
    assert "Traceback" not in err and "COMMAND" not in err
    assert not (tmp_path / "b.bin").exists()


def test_copy_refuses_a_part_size_past_5_gib(tmp_path: Path) -> None:
    from tensorstream.copy import copy

    src = tmp_path / "a.bin"
    src.write_bytes(b"z" * 10)
    with pytest.raises(ValueError, match="part_size must be at most"):
        copy(str(src), str(tmp_path / "b.bin"), part_size=2**80)
    assert not (tmp_path / "b.bin").exists()
