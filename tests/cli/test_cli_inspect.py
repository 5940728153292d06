"""``tensorstream inspect``: an aligned table with totals and escaped names, ``--json`` as one
document, the storage flags of the other commands, and exit status 1 with the URI named for
files that are missing, damaged or not models."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest

from fixtures_http import HTTP_TEST_TOKEN
from tensorstream.cli.main import main
from tensorstream.testing.http_server import HTTPTestServer

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
tensorizer = pytest.importorskip("tensorizer")

HOSTILE = "evil\x1b[2J\nname"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    st_torch.save_file({"embed.weight": torch.zeros(128, 64, dtype=torch.bfloat16),
                        HOSTILE: torch.zeros(3),
                        "norm": torch.ones(64, dtype=torch.bfloat16)}, str(path),
                       metadata={"format": "pt"})
    return path


def test_table_totals_and_escaped_names(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "inspect", str(model))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"{model}: safetensors, 1 file, {model.stat().st_size} bytes")
    assert "metadata: format=pt" in lines
    head = next(i for i, line in enumerate(lines) if line.startswith("NAME"))
    table = lines[head:head + 4]
    assert "\x1b" not in out and "evil\\x1b[2J\\nname" in out  # one line, escaped
    # aligned: every column starts where its heading does; BYTES right-aligned under it
    cols = [table[0].index(h) for h in ("DTYPE", "SHAPE")]
    end = table[0].index("BYTES") + len("BYTES")
    for row in table[1:]:
        assert all(row[c - 1] == " " and row[c] != " " for c in cols), row
        assert len(row) == end and row[end - 1].isdigit(), row
    embed = next(row for row in table if row.startswith("embed.weight"))
    assert embed.split() == ["embed.weight", "BF16", "[128,", "64]", "16384"]
    assert lines[-1] == ("3 tensors, 16524 bytes (16.1 KiB); dtypes: BF16 2 (16.1 KiB), "
                         "F32 1 (12 B)")


def test_json_is_one_document_with_exact_names(model: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", "--json", str(model))
    assert code == 0
    doc = json.loads(out)  # the whole output is one document
    assert doc["format"] == "safetensors" and doc["metadata"] == {"format": "pt"}
    assert {t["name"] for t in doc["tensors"]} == {"embed.weight", HOSTILE, "norm"}
    assert doc["totals"] == {"tensors": 3, "bytes": 16524,
                             "dtypes": {"BF16": {"tensors": 2, "bytes": 16512},
                                        "F32": {"tensors": 1, "bytes": 12}}}
    assert doc["bytes_read"] < doc["size"] or doc["size"] <= 64 << 10


def test_sharded_and_tensorizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for k in (1, 2):
        st_torch.save_file({f"w{k}": torch.ones(k, 2)}, str(tmp_path / f"s{k}.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 24}, "weight_map": {"w1": "s1.safetensors",
                                                        "w2": "s2.safetensors"}}))
    code, out, _ = run(capsys, "inspect", str(tmp_path) + "/")
    assert code == 0
    assert "index metadata: total_size=24" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("w")]
    assert rows == [["w1", "F32", "[1,", "2]", "8", "s1.safetensors"],
                    ["w2", "F32", "[2,", "2]", "16", "s2.safetensors"]]
    buf = io.BytesIO()
    buf.close = lambda: None  # type: ignore[method-assign]
    s = tensorizer.TensorSerializer(buf, encryption=tensorizer.EncryptionParams.random())
    s.write_state_dict({"a": torch.ones(4)})
    s.close()
    (tmp_path / "m.tensors").write_bytes(buf.getvalue())
    code, out, _ = run(capsys, "inspect", str(tmp_path / "m.tensors"))
    assert code == 0 and "tensorizer" in out and "encrypted: tensor data is encrypted" in out
    assert ["a", "float32", "[4]", "16"] in [line.split() for line in out.splitlines()]


def test_storage_flags_and_redaction(http_token_server: HTTPTestServer, http_reset: None,
                                     model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    http_token_server.put("cli-inspect/m.safetensors", model.read_bytes())
    url = http_token_server.url("cli-inspect/m.safetensors")
    code, out, err = run(capsys, "inspect", "--token", HTTP_TEST_TOKEN, url)
    assert code == 0, err
    assert "embed.weight" in out and HTTP_TEST_TOKEN not in out + err
    code, out, err = run(capsys, "--retries", "1", "inspect", url)  # no token: refused
    assert code == 1 and "cli-inspect/m.safetensors" in err and "Traceback" not in err
    code, out, err = run(capsys, "inspect", "--retries", "1",
                         url + f"?X-Amz-Signature={HTTP_TEST_TOKEN}")
    assert HTTP_TEST_TOKEN not in out + err


@pytest.mark.parametrize("blob", [b"\x7fELF" + bytes(100), struct.pack("<Q", 1 << 40) + b"{}",
                                  struct.pack("<Q", 6) + b"{\"a\":1", b""])
def test_bad_files_exit_1_naming_the_uri(blob: bytes, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(blob)
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 1 and out == ""
    assert err.startswith("tensorstream: error: ") and str(path) in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_file_and_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "inspect", str(tmp_path / "nope.safetensors"))
    assert code == 1 and "nope.safetensors" in err
    assert run(capsys, "inspect")[0] == 2
    code, out, _ = run(capsys, "inspect", "--help")
    assert code == 0 and out.startswith("usage: tensorstream inspect [options] URI")
    for needle in ("--json", "--endpoint-url", "--token", "examples:"):
        assert needle in out



def test_a_header_value_of_megabytes_is_one_short_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 2 MB dtype: the error was the whole value, and redacting it took hours (no output)."""
    body = json.dumps({"a": {"dtype": "x" * 2_000_000, "shape": [2],
                             "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "dtype.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body + bytes(8))
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "dtype.safetensors" in err and "unsupported dtype 'xxx" in err and len(err) < 1000


@pytest.mark.parametrize(("text", "value"), [("NaN", "NaN"), ("1e999", "Infinity"),
                                             ("-Infinity", "-Infinity")])
def test_json_is_valid_json_for_non_finite_index_metadata(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, value: str) -> None:
    """Python's json reads NaN and Infinity (not JSON) and 1e999 (JSON, too large for a float)
    into floats that json.dumps writes as NaN / Infinity: `inspect --json` of such an index
    printed a document no strict JSON parser (jq, JavaScript) reads."""
    st_torch.save_file({"w": torch.ones(2)}, str(tmp_path / "s.safetensors"))
    meta = f'{{"total_size": {text}, "nested": [1.5, {{"x": {text}}}]}}'
    (tmp_path / "model.safetensors.index.json").write_text(
        f'{{"metadata": {meta}, "weight_map": {{"w": "s.safetensors"}}}}')
    code, out, err = run(capsys, "inspect", "--json", str(tmp_path) + "/")
    assert code == 0, err

    def strict(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    doc = json.loads(out, parse_constant=strict)
    assert doc["index_metadata"] == {"total_size": value, "nested": [1.5, {"x": value}]}
    code, out, _ = run(capsys, "inspect", str(tmp_path) + "/")
    assert code == 0 and "index metadata: total_size=" in out


def test_a_long_name_pads_no_other_row(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Every row was padded to the longest name: one 100,000-character name among 2,000
    tensors (a 232 KB file) printed 200 MB. Columns are at most 60 characters wide; a
    longer cell is printed whole and pushes only its own row."""
    long = "L" * 100_000
    tensors = {f"t{i}": torch.ones(1) for i in range(2000)}
    tensors[long] = torch.ones(1)
    st_torch.save_file(tensors, str(tmp_path / "m.safetensors"))
    code, out, err = run(capsys, "inspect", str(tmp_path / "m.safetensors"))
    assert code == 0, err
    assert len(out) < 100_000 + 2001 * 100
    lines = out.splitlines()
    assert any(line.startswith(long + "  F32") for line in lines)
    rows = [line for line in lines if line.startswith("t")]
    assert len(rows) == 2000 and len({line.index("F32") for line in rows}) == 1


def test_a_name_with_a_backslash_is_told_from_one_with_a_line_break(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Both printed as a\nb: the table showed two tensors under one name.
    path = tmp_path / "two.safetensors"
    st_torch.save_file({"a\\nb": torch.zeros(1), "a\nb": torch.zeros(2)}, str(path))
    code, out, err = run(capsys, "inspect", str(path))
    assert code == 0, err
    names = sorted(line.split()[0] for line in out.splitlines() if line.startswith("a"))
    assert names == ["a\\\\nb", "a\\nb"], out
