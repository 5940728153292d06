"""Every Python and shell example in README.md and docs/*.md runs here (Sybil).

Each page is one test: its fenced blocks run in order, Python blocks in one
namespace per page, shell blocks with ``bash -euo pipefail`` in a scratch
directory. The pages run against real servers on loopback: moto's S3 server
(signatures checked) with the buckets the examples name (``models``,
``bucket``, ``keys``), reached through the environment as serving code
would (``AWS_*``, see docs/testing.md's environment mode).

* A Python block that defines pytest tests (``def test_...``) is written to a
  file of the page's scratch project and run with pytest there (with
  tensorstream's plugin, so its fixtures are the real servers); blocks
  fenced with ``title="path"`` (``ini``, ``python``) are written as that file.
* ``<!-- invisible-code-block: python -->`` comments set up names an example
  assumes (a ``model``...), as Sybil defines them.
* An example that cannot run here is preceded by
  ``<!-- skip: next "why" -->`` (Sybil's skip directive; a reason is required,
  :func:`test_every_skip_says_why`), or ``if(not CUDA, reason="...")`` for one
  that runs where a GPU is present.
* Shell blocks name the hosts a reader has (``http://minio:9000``, ``redis://cache:6379``,
  ``https://host/``, AWS's public ``s3://public-models``) and ``/models/``: :data:`HOSTS`
  stands loopback servers (moto, a ``redis-server``, an HTTP object server, a second moto
  that takes unsigned requests) and the page's scratch directory in for them, so
  the command lines run as written. A ``console`` transcript runs its ``$`` lines (its output
  is not compared: timings, dates and paths vary); ``jq`` and ``xxd`` are stood in for by
  Python where they are not installed.
* Blocks in other languages (``text``, ``toml``, untitled ``ini``) are output or
  configuration, not commands; :func:`test_every_block_has_a_known_language`
  keeps a new language from being silently ignored.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sybil import Example, Region, Sybil
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, RawFencedCodeBlockLexer

import tensorstream

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "bash", "sh", "console"}
NOT_COMMANDS = {"text", "toml", "ini", "json", "yaml"}
BUCKETS = ("models", "bucket", "keys")
#: placeholder in a shell block -> what stands in for it (a pattern, its replacement's name in
#: the page's namespace ``__hosts__``); ``/models/`` only where it begins a word, never in
#: ``s3://models/``.
HOSTS = {r"http://minio:9000": "s3", r"redis://cache:6379": "redis", r"https://host/": "http",
         r"https://s3\.amazonaws\.com": "aws",  # a public bucket: moto without signatures
         r"(?<![\w:/])/models/": "models"}
#: Python stand-ins for tools a shell example pipes into, where they are not installed.
SHIMS = {
    "jq": "import json, sys; json.dump(json.load(sys.stdin), sys.stdout, indent=2); print()",
    "xxd": "import sys, binascii; data = sys.stdin.buffer.read()\n"
           "for i in range(0, len(data), 16): print(f'{i:08x}: {binascii.hexlify(data[i:i+16]).decode()}')",
}


# -- the parser: every fenced block, with its language and title ---------------------------------


class FencedBlocks:
    """A Sybil parser yielding every fenced block (and invisible Python block) as
    ``(language, title, source)`` evaluated by :func:`evaluate`."""

    def __init__(self) -> None:
        self.fenced = RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<info>[^\n]*)$\n", re.M))
        self.invisible = DirectiveInHTMLCommentLexer(directive="invisible-code-block",
                                                     arguments=".+")

    def __call__(self, document: Any) -> Iterator[Region]:
        for region in self.fenced(document):
            info = str(region.lexemes["info"]).strip()
            language, _, attrs = info.partition(" ")
            title = re.search(r'title="([^"]+)"', attrs)
            yield Region(region.start, region.end,
                         (language, title.group(1) if title else None, str(region.lexemes["source"])),
                         evaluate)
        for region in self.invisible(document):
            yield Region(region.start, region.end,
                         (str(region.lexemes["arguments"]).strip(), None,
                          textwrap.dedent(str(region.lexemes["source"]))), evaluate)


SYBIL = Sybil(parsers=[FencedBlocks(), SkipParser()], path=str(ROOT))


def evaluate(example: Example) -> None:
    language, title, source = example.parsed
    ns = example.namespace
    project: Path = ns["__project__"]
    if title:
        target = project / title
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source)
        if language == "python" and _defines_tests(source):
            _run_pytest(project, title, example)
        return
    if language == "python":
        if _defines_tests(source):
            name = f"test_doc_{Path(example.path).stem.replace('-', '_')}_{example.line}.py"
            (project / name).write_text(source)
            _run_pytest(project, name, example)
        else:
            _exec(source, ns, f"{example.path}:{example.line}")
    elif language in ("bash", "sh"):
        _shell(source, ns, example)
    elif language == "console":
        commands = [line[2:] for line in source.splitlines() if line.startswith("$ ")]
        _shell("\n".join(commands), ns, example)
    elif language == "ini" and "[pytest]" in source:
        (project / "pytest.ini").write_text(source)  # the settings the next tests run with


def _defines_tests(source: str) -> bool:
    return re.search(r"^(async )?def test_", source, re.M) is not None


def _exec(source: str, ns: dict[str, Any], where: str) -> None:
    # Compiled as a reader's script is: an `await` outside a function, which a notebook
    # takes, is a SyntaxError there that stops the whole script before its first line.
    try:
        code = compile(source, where, "exec")
    except SyntaxError as exc:
        if "outside" in str(exc) and ("await" in str(exc) or "async" in str(exc)):
            raise AssertionError(f"{where}: awaits at top level, which a script cannot: "
                                 "write asyncio.run(...), or await inside an async def") from exc
        raise
    exec(code, ns)


def _with_hosts(source: str, hosts: dict[str, str]) -> str:
    """``source`` with each :data:`HOSTS` placeholder replaced by its loopback stand-in."""
    for pattern, name in HOSTS.items():
        if name in hosts:
            source = re.sub(pattern, lambda _m, v=hosts[name]: v, source)
    return source


def _shell(source: str, ns: dict[str, Any], example: Example) -> None:
    source = _with_hosts(source, ns.get("__hosts__", {}))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", source], cwd=ns["__project__"],
                          env=ns["__env__"], capture_output=True, text=True, timeout=300,
                          errors="replace")  # (cat prints an object's bytes)
    if done.returncode != 0:
        raise AssertionError(f"{example.path}:{example.line}: exit {done.returncode}\n"
                             f"{source}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")


def _run_pytest(project: Path, name: str, example: Example) -> None:
    if not (project / "pytest.ini").exists():
        (project / "pytest.ini").write_text(
            "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "REDIS_"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run([sys.executable, "-m", "pytest", name, "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "--timeout=300"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)
    tail = done.stdout[-3000:]
    if done.returncode != 0 or " passed" not in done.stdout:
        raise AssertionError(f"{example.path}:{example.line}: the example's tests failed\n{tail}"
                             f"\n{done.stderr[-2000:]}")
    # What the run counted, for a page that says it ("13 pass and 2 skip") to check in an
    # invisible block: ``assert pytest_outcome == {"passed": 13, "skipped": 2}``.
    summary = done.stdout.strip().splitlines()[-1]
    example.namespace["pytest_outcome"] = {
        word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|failed|error)", summary)}


# -- the servers the pages run against ------------------------------------------------------------


class TinyModel(torch.nn.Module):
    """What the pages call ``model``: small, with nested modules and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(32, 32) for _ in range(2)])
        self.register_buffer("scale", torch.ones(2))


class World:
    """moto's S3 server with the examples' buckets and files, and the environment reaching it."""

    FILES = (("models", "llama/model.tensors"), ("models", "llama.tensors"),
             ("models", "m.tensors"), ("models", "model.tensors"), ("bucket", "model.tensors"))

    def __init__(self, s3: Any, sandbox: Path, redis: Any = None, http: Any = None,
                 public: Any = None) -> None:
        from tensorstream.testing.s3_server import isolated_s3_env

        self.s3, self.redis, self.http, self.public = s3, redis, http, public
        for bucket in BUCKETS:
            s3.create_bucket(bucket)
        torch.manual_seed(0)
        model_file = sandbox / "model.tensors"
        tensorstream.serialize(TinyModel().state_dict(), model_file)
        self.data = model_file.read_bytes()
        self.extra = _safetensors_files(sandbox)
        opts = s3.options()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "REDIS_"))}
        env.update(isolated_s3_env(str(sandbox)))
        shims = sandbox / "shims"
        shims.mkdir()
        for tool, code in SHIMS.items():
            if shutil.which(tool) is None:
                (shims / tool).write_text(f"#!{sys.executable}\n{code}\n")
                (shims / tool).chmod(0o755)
        env.update({
            "AWS_ACCESS_KEY_ID": opts["s3_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": opts["s3_secret_access_key"],
            "AWS_REGION": opts["s3_region"],
            "AWS_ENDPOINT_URL": opts["s3_endpoint"],
            "NO_PROXY": "127.0.0.1,localhost",
            "PYTHONPATH": str(ROOT / "src"),
            "PATH": os.pathsep.join((os.path.dirname(sys.executable), str(shims),
                                     os.environ.get("PATH", ""))),
        })
        self.env = env
        self.hosts = {"s3": opts["s3_endpoint"]}
        if redis is not None:
            self.hosts["redis"] = redis.url().rstrip("/")
        if http is not None:
            self.hosts["http"] = http.url("")
            http.put("model.tensors", self.data)
        if public is not None:
            self.hosts["aws"] = public.options()["s3_endpoint"]
            # readable by anyone, as a public bucket on AWS is (moto checks the ACLs)
            public.client.create_bucket(Bucket="public-models", ACL="public-read")
            public.client.put_object(Bucket="public-models", Key="llama/model.tensors",
                                     Body=self.data, ACL="public-read")

    def reset(self) -> None:
        """Every page starts from the same objects (pages write and overwrite)."""
        client = self.s3.client
        for bucket in BUCKETS:
            keys = [{"Key": o["Key"]} for o in
                    client.list_objects_v2(Bucket=bucket).get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
        for bucket, key in self.FILES:
            self.s3.put(bucket, key, self.data)
        for key, data in self.extra.items():
            self.s3.put("models", key, data)
        if self.redis is not None:
            self.redis.client().flushall()


def _safetensors_files(sandbox: Path) -> dict[str, bytes]:
    """The same model as safetensors under ``models/llama/``: one file, and two shards
    with their ``model.safetensors.index.json`` (docs/safetensors.md, README)."""
    import json

    from safetensors.torch import save_file

    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in TinyModel().state_dict().items()}
    names = sorted(state)
    out: dict[str, bytes] = {}
    save_file(state, str(sandbox / "model.safetensors"), metadata={"format": "pt"})
    out["llama/model.safetensors"] = (sandbox / "model.safetensors").read_bytes()
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: state[n] for n in members}, str(sandbox / shard), metadata={"format": "pt"})
        out[f"llama/{shard}"] = (sandbox / shard).read_bytes()
        weight_map.update(dict.fromkeys(members, shard))
    index = {"metadata": {"total_size": sum(t.nbytes for t in state.values())},
             "weight_map": weight_map}
    out["llama/model.safetensors.index.json"] = json.dumps(index).encode()
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from tensorstream.testing.http_server import HTTPTestServer
    from tensorstream.testing.redis_server import RedisServer
    from tensorstream.testing.s3_server import MotoS3Server

    with MotoS3Server(auth=True) as s3, RedisServer() as redis, HTTPTestServer() as http, \
            MotoS3Server(auth=False) as public:
        yield World(s3, tmp_path_factory.mktemp("docs-sandbox"), redis, http, public)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_examples_run(page: Path, world: World, monkeypatch: pytest.MonkeyPatch,
                      tmp_path: Path) -> None:
    world.reset()
    for name in list(os.environ):
        if name.startswith(("AWS_", "S3_", "REDIS_")):
            monkeypatch.delenv(name)
    for name, value in world.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    # What an example may change in this process is put back afterwards.
    from tensorstream.providers import registry

    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    for name in ("", "tensorstream"):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "level", logger.level)
    document = SYBIL.parse(page)
    torch.manual_seed(0)
    document.namespace.update({
        "__name__": "__main__", "__project__": tmp_path, "__env__": world.env,
        "__hosts__": {**world.hosts, "models": f"{tmp_path}/models/"},
        "CUDA": torch.cuda.is_available(), "tensorstream": tensorstream, "torch": torch,
        # "your model" in the pages: matches the files on the test server
        "MyModel": TinyModel, "model": TinyModel(),
    })
    ran, skipped = 0, []
    for example in document.examples():
        try:
            example.evaluate()
        except unittest.SkipTest as why:
            skipped.append(f"line {example.line}: {why}")
            continue
        if example.parsed and example.parsed[0] in RUN:
            ran += 1
    print(f"{page.name}: {ran} example(s) run, {len(skipped)} skipped", *skipped, sep="\n  ")


def _fences(text: str) -> list[tuple[int, str]]:
    out, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})(.*)$", line)
        if m:
            if not inside:
                out.append((number, m.group(2).strip().split(" ")[0]))
            inside = not inside
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_block_has_a_known_language(page: Path) -> None:
    unknown = [(n, lang) for n, lang in _fences(page.read_text()) if lang not in RUN | NOT_COMMANDS]
    assert not unknown, (f"{page.name}: blocks at {unknown} have no language this test knows; "
                         f"use one of {sorted(RUN | NOT_COMMANDS)}")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_skip_says_why(page: Path) -> None:
    for directive in re.findall(r"<!--\s*skip:\s*(.*?)-->", page.read_text(), re.S):
        assert re.match(r'(next|start)\s+(".+"|if\(.+reason=".+"\))\s*$', directive.strip()), (
            f"{page.name}: skip without a reason: {directive!r}")


def test_the_docs_test_fails_on_a_broken_example(tmp_path: Path) -> None:
    page = tmp_path / "broken.md"
    page.write_text("```python\nimport tensorstream\ntensorstream.stat_nope\n```\n")
    document = SYBIL.parse(page)
    document.namespace.update({"__project__": tmp_path, "__env__": dict(os.environ)})
    with pytest.raises(AttributeError):
        for example in document.examples():
            example.evaluate()
    # An await at top level: a notebook takes it, a reader's script does not even start.
    page.write_text("```python\nimport tensorstream\nx = await tensorstream.stat('a')\n```\n")
    document = SYBIL.parse(page)
    document.namespace.update({"__project__": tmp_path, "__env__": dict(os.environ)})
    with pytest.raises(AssertionError, match="awaits at top level"):
        for example in document.examples():
            example.evaluate()
    page.write_text("```bash\nfalse\n```\n")
    document = SYBIL.parse(page)
    document.namespace.update({"__project__": tmp_path, "__env__": dict(os.environ)})
    with pytest.raises(AssertionError, match="exit 1"):
        for example in document.examples():
            example.evaluate()


def test_scratch_dirs_are_not_left_behind() -> None:
    # The runner writes only under pytest's tmp_path (checked: nothing in the repository).
    assert not list(ROOT.glob("test_doc_*.py"))
    assert shutil.which("bash") and tempfile.gettempdir()
