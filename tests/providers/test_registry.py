"""The one table of schemes, options and credential describers."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import pytest

import tensorstream
from tensorstream import errors
from tensorstream.credentials.report import CredentialReport, ReportLine
from tensorstream.providers import registry
from tensorstream.providers.base import Capabilities, ObjectInfo, Pin, Provider


class _Toy(Provider):
    service = "toy"
    capabilities: ClassVar[Capabilities] = Capabilities()
    option_names = frozenset({"toy_colour"})

    @classmethod
    def from_uri(cls, uri: Any, **options: Any) -> Provider:
        options.pop("config", None)
        return cls()

    async def stat(self, path: str) -> ObjectInfo:
        return ObjectInfo(path=path, size=0)

    async def readinto(self, path: str, offset: int, buffer: memoryview, *,
                       pin: Pin | None = None) -> int:
        return 0

    @classmethod
    def describe_credentials(cls, parsed: Any, options: dict[str, Any]) -> CredentialReport:
        return CredentialReport(parsed.redacted(), (ReportLine("colour", "blue", "toy default"),))


@pytest.fixture
def toy_scheme() -> Any:
    registry.register("toy", _Toy)
    yield "toy"
    registry._registry.pop("toy", None)


def test_known_options_come_from_the_service_configs() -> None:
    known = registry.known_option_names()
    from tensorstream.providers.http.config import OPTIONS as HTTP
    from tensorstream.providers.redis.config import OPTIONS as REDIS
    from tensorstream.providers.s3.config import OPTIONS as S3

    assert HTTP | REDIS | S3 | {"storage_options"} <= known
    assert "s3_region" in known and "redis_password" in known and "token" in known


@pytest.mark.parametrize("names", [
    set(), {"s3_region"}, {"redis_password"}, {"ca_bundle", "proxy"}, {"storage_options"},
    {"s3_regoin"}, {"s3_endpoint", "nope", "storage_options", "redis_db"}, {"toy_colour", "x"},
    {"s3_", "redis_", "http_"},
])
def test_unknown_option_names_as_the_whole_list_says(names: set[str], toy_scheme: str) -> None:
    registry.resolve_provider_class(toy_scheme)
    assert registry.unknown_option_names(names) == names - registry.known_option_names()


def test_a_prefixed_name_is_looked_up_in_its_own_service_first() -> None:
    code = ("import sys; import tensorstream.providers.registry as r\n"
            "assert r.unknown_option_names({'s3_region', 'redis_db'}) == set()\n"
            "print(sorted(m for m in sys.modules if m.startswith('tensorstream.providers.')"
            " and m.endswith('.config')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("['tensorstream.providers.redis.config', "
                                  "'tensorstream.providers.s3.config']")


def test_an_option_of_another_service_is_ignored_a_typo_is_refused(tmp_path: Any) -> None:
    tensorstream.get_provider(str(tmp_path), redis_password="x", s3_region="eu-west-1")
    with pytest.raises(errors.ConfigurationError, match="s3_regoin"):
        tensorstream.get_provider(str(tmp_path), s3_regoin="eu-west-1")


def test_opening_a_local_file_imports_no_other_services_config(tmp_path: Any) -> None:
    # Other services' option names are only looked up for an option this one does not take:
    # a local load pays no S3/HTTP/Redis/fsspec config imports (~8 ms) inside its clock.
    path = tmp_path / "x.bin"
    path.write_bytes(b"abc")
    code = ("import sys, tensorstream\n"
            f"with tensorstream.open({str(path)!r}, readahead=1 << 20) as f: assert f.read() == b'abc'\n"
            "print(sorted(m for m in sys.modules if m.startswith('tensorstream.providers.')"
            " and m.endswith('.config')))\n"
            f"with tensorstream.open({str(path)!r}, s3_region='eu-west-1') as f: f.read()\n"
            "print('tensorstream.providers.s3.config' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]


def test_third_party_options_and_describer_come_from_the_class(toy_scheme: str) -> None:
    registry.resolve_provider_class(toy_scheme)
    assert "toy_colour" in registry.known_option_names()
    report = tensorstream.describe_credentials("toy://somewhere/x")
    assert report.source_of("colour") == "toy default"


def test_describing_a_scheme_nothing_serves_is_unknown_scheme_error() -> None:
    # as open() says: a report of "the backend's defaults" for no backend misleads
    with pytest.raises(errors.UnknownSchemeError, match="nosuchscheme"):
        tensorstream.describe_credentials("nosuchscheme://host/x")
    assert tensorstream.describe_credentials("memory://x") is not None  # an fsspec protocol


def test_builtin_describer_used_until_the_scheme_is_replaced() -> None:
    report = tensorstream.describe_credentials("redis://:pw@host:6379/k")
    assert report.source_of("password") is not None and "pw" not in str(report)
    registry.register("redis", _Toy, replace=True)
    try:
        assert tensorstream.describe_credentials("redis://host/k").source_of("colour") == "toy default"
    finally:
        registry.register("redis", registry._BUILTIN["redis"].provider, replace=True)
        registry._replaced.discard("redis")


def test_service_configs_import_no_client_library() -> None:
    code = ("import sys; import tensorstream.providers.registry as r; r.known_option_names();"
            "import tensorstream.credentials.describe;"
            "print(sorted(m for m in ('aiohttp', 'botocore', 'aiobotocore', 'redis', 's3fs') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _Half(Provider):
    """A third-party provider that forgot its required methods."""

    service = "half"


@pytest.mark.parametrize("scheme", ["", "my://", "9fs", "my fs", 3, "myfs\n"])
def test_a_scheme_that_no_uri_can_have_is_refused(scheme: Any) -> None:
    with pytest.raises(errors.ConfigurationError, match=r"URI scheme.*registered: .*s3"):
        registry.register(scheme, _Toy)
    assert scheme not in registry._registry


def test_a_class_missing_required_methods_is_refused_when_registered() -> None:
    # Accepted before, it failed at the first open as "'NoneType' object has no attribute
    # 'service'" (the abstract from_uri's empty body returned None).
    with pytest.raises(TypeError, match=r"from_uri, readinto, stat; registered: .*s3"):
        registry.register("halftest", _Half)
    with pytest.raises(TypeError, match="not a tensorstream Provider subclass"):
        registry.register("halftest", object)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigurationError, match="'module:Class'"):
        registry.register("halftest", "os.path")
    assert "halftest" not in registry._registry


def test_a_duplicate_scheme_names_what_is_registered() -> None:
    with pytest.raises(errors.ConfigurationError, match=r"replace=True.*registered: .*https"):
        registry.register("s3", _Toy)


def test_a_provider_that_fails_to_import_names_itself_and_the_registered_schemes(
        tmp_path: Any) -> None:
    # an entry point's value is stored as this string and imported the same way, when first used
    registry.register("brokentest", "no_such_module_ts:Provider")
    registry.register("wrongattr", "tensorstream.uri:NoSuchProvider")
    try:
        with pytest.raises(ImportError, match=r"'no_such_module_ts:Provider' for scheme "
                           r"'brokentest' failed to import .*registered: .*s3"):
            tensorstream.open("brokentest://bucket/key")
        with pytest.raises(errors.ConfigurationError, match="has no 'NoSuchProvider'"):
            tensorstream.open("wrongattr://bucket/key")
    finally:
        registry._registry.pop("brokentest", None)
        registry._registry.pop("wrongattr", None)


def _distribution(root: Any, name: str, entry_points: str) -> None:
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{entry_points}\n")


def test_a_scheme_two_installed_packages_claim_is_refused_naming_both(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The one listed first on sys.path served it, without a word about the other
    _distribution(tmp_path, "tsplugin_a", "twicefs = plugin_a.provider:AProvider")
    _distribution(tmp_path, "tsplugin_b", "twicefs = plugin_b.provider:BProvider\n"
                  "oncefs = plugin_b.provider:OnceProvider")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    monkeypatch.setattr(registry, "_ambiguous", {})
    with pytest.raises(errors.ConfigurationError,
                       match=r"'twicefs' is claimed by more than one .*plugin_a.provider:"
                             r"AProvider, plugin_b.provider:BProvider.*replace=True"):
        tensorstream.open("twicefs://bucket/key")
    # the other entry point of the package is served as before (its import fails here)
    with pytest.raises(ImportError, match=r"'plugin_b.provider:OnceProvider' for scheme 'oncefs'"):
        tensorstream.open("oncefs://bucket/key")
    # a choice made in code settles it
    registry.register("twicefs", _Toy)
    assert registry.resolve_provider_class("twicefs") is _Toy


@pytest.fixture
def toy_by_name() -> Any:
    """The toy provider registered as 'module:Class' (as an entry point names it), not
    imported yet; and a second third-party scheme whose module is missing."""
    registry.register("toy", f"{__name__}:_Toy")
    registry.register("gone", "no_such_module_of_tensorstream_tests:Provider")
    yield "toy"
    registry._registry.pop("toy", None)
    registry._registry.pop("gone", None)


def test_a_third_party_option_is_taken_before_its_provider_is_imported(
        toy_by_name: str, tmp_path: Any) -> None:
    """One options dict for a cp between a local folder and a third-party store: the
    local side was resolved first and refused toy_colour as a typo, because the toy
    provider's class (which names it) was not imported yet; the other order worked."""
    tensorstream.get_provider(str(tmp_path), toy_colour="blue")
    assert registry.unknown_option_names({"toy_colour", "toy_color"}) == {"toy_color"}
    with pytest.raises(errors.ConfigurationError, match="toy_color"):
        tensorstream.get_provider(str(tmp_path), toy_color="blue")


@pytest.mark.parametrize(("typo", "meant"), [("s4", "s3"), ("htps", "https"), ("redsi", "redis")])
def test_a_scheme_typo_names_the_scheme_meant(typo: str, meant: str) -> None:
    # A new user's first URI: the error says which scheme was meant, not only the list.
    with pytest.raises(errors.UnknownSchemeError, match=f"did you mean '{meant}://'"):
        registry.resolve_provider_class(typo)


def test_a_scheme_like_none_suggests_nothing() -> None:
    with pytest.raises(errors.UnknownSchemeError) as caught:
        registry.resolve_provider_class("nosuchscheme")
    assert "did you mean" not in str(caught.value)
