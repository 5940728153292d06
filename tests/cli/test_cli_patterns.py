"""``--exclude``/``--include`` and s5cmd's wildcard sources (``cp``/``ls``/``rm``/``sync``):
what they select, and the usage errors for a pattern that can never match; the real CLI
in a subprocess against local files, moto and redis-server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli_env import cli, files_under, s3_env

S3_BUCKET = "tensorstream-tests"


# -- --exclude/--include ------------------------------------------------------------
def test_exclude_include_in_order_and_dryrun(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for name in ("a.safetensors", "b.pt", "sub/c.safetensors", "sub/d.json"):
        (src / name).write_bytes(name.encode())
    r = cli("cp", "-r", "--exclude", "*", "--include", "*.safetensors", str(src),
            str(tmp_path / "o1"))
    assert r.returncode == 0, r.stderr
    assert sorted(files_under(tmp_path / "o1")) == ["a.safetensors", "sub/c.safetensors"]
    # order matters: the last matching rule wins, so an --include before any --exclude
    # changes nothing (refused: s5cmd and rclone read it as "only these")
    r = cli("cp", "-r", "--include", "*.safetensors", "--exclude", "*", str(src),
            str(tmp_path / "o2"))
    assert r.returncode == 2 and not (tmp_path / "o2").exists()
    assert "--exclude '*' --include '*.safetensors'" in r.stderr
    r = cli("cp", "-r", "--exclude", "*", "--include", "*.safetensors", "--exclude", "sub/*",
            str(src), str(tmp_path / "o2"))
    assert r.returncode == 0 and sorted(files_under(tmp_path / "o2")) == ["a.safetensors"]
    r = cli("cp", "-r", "--exclude", "sub/*", "--dryrun", str(src), str(tmp_path / "o3"))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [
        f"(dryrun) copy: {src / n} -> {tmp_path / 'o3' / n}" for n in ("a.safetensors", "b.pt")]
    assert not (tmp_path / "o3").exists()
    assert r.stderr.strip() == "(dryrun) would copy 2 files"


def test_a_pattern_that_can_never_match_is_a_usage_error(tmp_path: Path) -> None:
    """``--exclude /abs/path/x`` (or an empty pattern) matches no key, since keys are relative
    to SRC: what it was meant to leave out was copied without a word."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "secret.key").write_bytes(b"k")
    for cmd in (["cp", "-r"], ["sync"]):
        for flag, pattern in [("--exclude", str(src / "secret.key")), ("--include", "")]:
            r = cli(*cmd, flag, pattern, str(src), str(tmp_path / "dst"))
            assert r.returncode == 2, r.stderr
            assert r.stderr.startswith(f"tensorstream: error: {flag} ") and "Traceback" not in r.stderr
    assert not (tmp_path / "dst").exists()
    # rm -r: such a pattern deleted what it was meant to keep
    r = cli("rm", "-r", "--exclude", str(src / "secret.key"), str(src))
    assert r.returncode == 2 and "--exclude" in r.stderr and "matches no key" in r.stderr
    assert (src / "secret.key").read_bytes() == b"k"


def test_a_pattern_naming_a_directory_is_a_usage_error_that_says_what_to_write(
        tmp_path: Path) -> None:
    """``--exclude keep/`` matches no key (keys name objects; 'keep/*' is what matches): `rm -r`
    deleted everything under keep/, `sync --delete` the destination's keep/, exit 0."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "keep").mkdir(parents=True)
    (src / "keep" / "a.bin").write_bytes(b"a")
    (src / "b.bin").write_bytes(b"b")
    (dst / "keep").mkdir(parents=True)
    (dst / "keep" / "mine.bin").write_bytes(b"mine")
    for argv in (["rm", "-r", "--exclude", "keep/", str(src)],
                 ["sync", "--delete", "--exclude", "keep/", str(tmp_path / "empty"), str(dst)],
                 ["cp", "-r", "--include", "*/", str(src), str(tmp_path / "out")]):
        r = cli(*argv)
        assert r.returncode == 2, r.stderr
        assert "matches no key" in r.stderr and "/*'" in r.stderr
    assert (src / "keep" / "a.bin").read_bytes() == b"a"
    assert (dst / "keep" / "mine.bin").read_bytes() == b"mine"
    r = cli("rm", "-r", "--dryrun", "--exclude", "keep/*", str(src))
    assert r.returncode == 0 and "keep" not in r.stdout and "b.bin" in r.stdout, r.stderr


# -- wildcards (s5cmd) ------------------------------------------------------------
def test_wildcard_sources_copy_what_they_match_like_s5cmd(tmp_path: Path, moto_s3: Any) -> None:
    for key in ("wild/llama/model-00001.safetensors", "wild/llama/model-00002.safetensors",
                "wild/llama/config.json", "wild/llama/sub/extra.safetensors",
                "wild/llama-evil/model.safetensors", "wild/mistral/config.json"):
        moto_s3.put(S3_BUCKET, key, key.encode())
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    out = tmp_path / "out"
    r = cli("cp", *ep, f"s3://{S3_BUCKET}/wild/llama/*.safetensors", str(out) + "/", env=env)
    assert r.returncode == 0, r.stderr
    # '*' crosses '/', names are relative to the last '/' before the first wildcard.
    assert files_under(out) == {
        "model-00001.safetensors": b"wild/llama/model-00001.safetensors",
        "model-00002.safetensors": b"wild/llama/model-00002.safetensors",
        "sub/extra.safetensors": b"wild/llama/sub/extra.safetensors"}
    r = cli("cp", *ep, f"s3://{S3_BUCKET}/wild/*/config.json",
            f"s3://{S3_BUCKET}/wild/llama/model-0000?.safetensors", str(tmp_path / "o2"), env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(files_under(tmp_path / "o2")) == [
        "llama/config.json", "mistral/config.json", "model-00001.safetensors",
        "model-00002.safetensors"]
    r = cli("ls", *ep, f"s3://{S3_BUCKET}/wild/llama*/*.safetensors", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "llama-evil/model.safetensors", "llama/model-00001.safetensors",
        "llama/model-00002.safetensors", "llama/sub/extra.safetensors"]


def test_wildcard_sources_say_what_went_wrong(tmp_path: Path, moto_s3: Any) -> None:
    moto_s3.put(S3_BUCKET, "wild2/a.bin", b"a")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    r = cli("cp", *ep, f"s3://{S3_BUCKET}/wild2/*.json", str(tmp_path / "o") + "/", env=env)
    assert r.returncode == 1 and "no object matches" in r.stderr
    r = cli("ls", *ep, f"s3://{S3_BUCKET}/wild2/*.json", env=env)
    assert r.returncode == 1 and "no object matches" in r.stderr
    r = cli("cp", *ep, "s3://tensorstream-*/wild2/a.bin", str(tmp_path / "o") + "/", env=env)
    assert r.returncode != 0 and "not bucket names" in r.stderr
    r = cli("cp", *ep, "--raw", f"s3://{S3_BUCKET}/wild2/*.bin", str(tmp_path / "o") + "/",
            env=env)
    assert r.returncode == 1 and "no such object" in r.stderr  # taken literally
    r = cli("sync", *ep, "--delete", f"s3://{S3_BUCKET}/wild2/*", str(tmp_path / "o"), env=env)
    assert r.returncode == 2 and "--delete with the wildcard source" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_wildcard_matches_redis_keys(tmp_path: Path, redis_server: Any) -> None:
    src = tmp_path / "src"
    (src / "m").mkdir(parents=True)
    for name in ("m/a.bin", "m/b.txt", "c.bin"):
        (src / name).write_bytes(name.encode())
    assert cli("cp", "-r", str(src), redis_server.url("wild/")).returncode == 0
    r = cli("cp", redis_server.url("wild/*.bin"), str(tmp_path / "out") + "/")
    assert r.returncode == 0, r.stderr
    assert files_under(tmp_path / "out") == {"c.bin": b"c.bin", "m/a.bin": b"m/a.bin"}


def test_rm_of_a_wildcard_deletes_what_it_matches_and_nothing_else(tmp_path: Path,
                                                                   moto_s3: Any) -> None:
    for key in ("wildrm/a.pt", "wildrm/sub/b.pt", "wildrm/c.bin", "wildrm-x/d.pt"):
        moto_s3.put(S3_BUCKET, key, b"x")
    env, ep = s3_env(moto_s3, tmp_path), ["--endpoint-url", moto_s3.endpoint_url]
    r = cli("rm", *ep, "--dryrun", f"s3://{S3_BUCKET}/wildrm/*.pt", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"(dryrun) delete: s3://{S3_BUCKET}/wildrm/a.pt",
                                     f"(dryrun) delete: s3://{S3_BUCKET}/wildrm/sub/b.pt"]
    r = cli("rm", *ep, "--exclude", "sub/*", f"s3://{S3_BUCKET}/wildrm/*.pt", env=env)
    assert r.returncode == 0 and r.stdout.splitlines() == [
        f"delete: s3://{S3_BUCKET}/wildrm/a.pt"]
    r = cli("ls", *ep, "-r", f"s3://{S3_BUCKET}/", env=env)
    assert {"wildrm/sub/b.pt", "wildrm/c.bin", "wildrm-x/d.pt"} <= set(r.stdout.split())
    assert "wildrm/a.pt" not in r.stdout.split()
    r = cli("rm", *ep, f"s3://{S3_BUCKET}/wildrm/*.json", env=env)
    assert r.returncode == 1 and "no object matches" in r.stderr
    r = cli("rm", *ep, "--raw", f"s3://{S3_BUCKET}/wildrm/*.pt", env=env)
    assert r.returncode != 0 and "wildrm/sub/b.pt" not in r.stdout  # one literal key only
