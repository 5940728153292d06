"""What a profile of the AWS config file says about S3 (level 5 of docs/s3.md), read as
botocore reads it, so that tensorstream's own choices (a default addressing style, an
endpoint from a variable) do not override what boto3 would honour:

- ``endpoint_url`` of the profile, and of its ``services`` section's ``s3`` sub-section
  (which wins over the profile's);
- ``s3 = addressing_style = path|virtual|auto``;
- ``ignore_configured_endpoint_urls`` (or ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``), under
  which botocore ignores the endpoints of the AWS variables and of the config file.

botocore's parser is imported only when the file exists or a profile is named.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from ...credentials.base import Sourced
from ...errors import ConfigurationError

__all__ = ["NO_CREDENTIALS_ADVICE", "ProfileConfig", "aws_file", "aws_files", "chain_source",
           "config_file", "unreadable",
           "config_profile_name", "ignore_configured_endpoints", "profile_setting_file",
           "read_profile_config"]

ADDRESSING_STYLES = ("path", "virtual", "auto")
IGNORE_VARIABLE = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"
#: What to do when no key pair is found anywhere (said after the places searched).
NO_CREDENTIALS_ADVICE = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile in ~/.aws), "
                         "or anonymous=True (tensorstream: --no-sign-request) for a public bucket")


def config_file(env: Mapping[str, str]) -> str:
    """The AWS config file as the user named it (for messages)."""
    return aws_file(env, "config")


def config_profile_name(profile: str | None, env: Mapping[str, str]) -> str:
    """The profile botocore takes its configuration from: ``profile`` (chosen for the
    keys, and passed to botocore), else the one a variable names, in botocore's order
    (it reads it for its configuration even where the keys came from variables), else
    ``default``."""
    return profile or env.get("AWS_DEFAULT_PROFILE") or env.get("AWS_PROFILE") or "default"


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    """One profile of the AWS config file: its settings and its ``services`` section
    (never shown: a profile may hold ``aws_secret_access_key``)."""

    name: str
    path: str
    values: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    services: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def where(self, setting: str) -> str:
        """A source, e.g. ``~/.aws/config [profile default] endpoint_url``."""
        return f"{self.path} [profile {self.name}] {setting}"

    def endpoint(self) -> Sourced[str] | None:
        """botocore's order: the services section's ``s3`` endpoint, then the profile's."""
        s3 = self.services.get("s3")
        if s3 is not None and not isinstance(s3, Mapping):
            # botocore failed with an AttributeError inside its credential chain
            raise ConfigurationError(
                f"{self.path} [services {self.values.get('services')}] s3 is a value; it must "
                "be a sub-section: 's3 =' then indented lines such as 'endpoint_url = ...'")
        if isinstance(s3, Mapping) and s3.get("endpoint_url"):
            section = self.values.get("services")
            return Sourced(str(s3["endpoint_url"]),
                           f"{self.path} [services {section}] s3.endpoint_url")
        if isinstance(self.values.get("endpoint_url"), str) and self.values["endpoint_url"]:
            return Sourced(self.values["endpoint_url"], self.where("endpoint_url"))
        return None

    def addressing_style(self) -> Sourced[str] | None:
        s3 = self.values.get("s3")
        style = s3.get("addressing_style") if isinstance(s3, Mapping) else None
        if not style:
            return None
        if style not in ADDRESSING_STYLES:
            raise ConfigurationError(
                f"{self.where('s3.addressing_style')} must be one of "
                f"{', '.join(ADDRESSING_STYLES)}, got {style!r}")
        return Sourced(str(style), self.where("s3.addressing_style"))


def _named_by(profile: Sourced[str] | None, env: Mapping[str, str]) -> str | None:
    """Who named the profile botocore configures itself from (``None``: nobody)."""
    if profile is not None:
        return profile.source
    return next((f"env {v}" for v in ("AWS_DEFAULT_PROFILE", "AWS_PROFILE") if env.get(v)), None)


def _full(path: str) -> str:
    return os.path.expanduser(os.path.expandvars(path))


def unreadable(path: str) -> str | None:
    """Why the AWS file ``path`` (as the user named it) exists but cannot be read
    (botocore skips it without a word: configparser ignores the OSError); ``None`` when
    it is absent or readable."""
    full = _full(path)
    if not os.path.lexists(full) or (os.path.isfile(full) and os.access(full, os.R_OK)):
        return None
    if os.path.exists(full) and not os.path.isfile(full):
        return "not a regular file"
    return "permission denied" if os.path.exists(full) else "a dangling link"


def _defined_in_credentials(name: str, env: Mapping[str, str]) -> bool:
    """Whether the credentials file has profile ``name`` (or cannot be read: botocore's
    own error, mapped where it is raised, says so better)."""
    from botocore.configloader import raw_config_parse

    path = _full(env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials")
    if not os.path.isfile(path):
        return False
    try:
        return name in raw_config_parse(path)
    except Exception:
        return True


def read_profile_config(profile: Sourced[str] | None, env: Mapping[str, str]) -> ProfileConfig:
    """The profile botocore would configure itself from (empty when the file is absent,
    unreadable or unparsable: botocore reports those itself, mapped where it does).

    A profile a variable or option names that neither file defines is a
    :class:`ConfigurationError` (boto3 refuses it too; reads that needed no botocore
    client went on without it)."""
    name = config_profile_name(profile.value if profile else None, env)
    path = config_file(env)
    full = _full(path)
    named_by = _named_by(profile, env)
    loaded: dict[str, Any] = {}
    if os.path.isfile(full):
        from botocore.configloader import load_config

        try:
            loaded = load_config(full)
        except Exception:
            return ProfileConfig(name, path)
    # botocore refuses a named profile it cannot find, 'default' too (unnamed, it is optional)
    if named_by is not None and name not in loaded.get("profiles", {}) \
            and not _defined_in_credentials(name, env):
        credentials = env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"
        for which, named in (("config", path), ("credentials", credentials)):
            if (why := unreadable(named)) is not None:
                # it said "is not defined in" a file it could not read
                raise ConfigurationError(
                    f"AWS profile {name!r} ({named_by}): cannot read the AWS {which} file "
                    f"{named} ({why}), where it would be defined")
        raise ConfigurationError(
            f"AWS profile {name!r} ({named_by}) is not defined in {path}, {credentials}"
            + (f" (in {path} its section is [profile {name}], not [{name}])"
               if name in loaded else ""))
    values = loaded.get("profiles", {}).get(name) or {}
    if values.get("s3") is not None and not isinstance(values["s3"], Mapping):
        # botocore: "AttributeError: 'str' object has no attribute 'get'" building any client
        raise ConfigurationError(
            f"{path} [profile {name}] s3 is a value; it must be a sub-section: 's3 =' then "
            "indented lines such as 'addressing_style = path'")
    services: Mapping[str, Any] = {}
    if (section := values.get("services")) is not None:
        services = loaded.get("services", {}).get(section)
        if not services:
            # botocore: InvalidConfigError when it creates the client
            raise ConfigurationError(
                f"{path} [profile {name}] names services section {section!r}, which the "
                "file does not define")
    return ProfileConfig(name, path, values, services)


def profile_setting_file(name: str, setting: str, env: Mapping[str, str]) -> str:
    """The file (config or credentials, as the user named it) whose profile ``name`` holds
    ``setting`` (botocore merges the two); the config file when neither does."""
    from botocore.configloader import raw_config_parse

    credentials = env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"
    try:
        if setting in (raw_config_parse(_full(credentials)).get(name) or {}):
            return credentials
    except Exception:  # absent or unparsable: not there
        pass
    return config_file(env)


def ignore_configured_endpoints(env: Mapping[str, str],
                                profile: ProfileConfig) -> Sourced[bool] | None:
    """Whether botocore ignores configured endpoints (the variable, when set, wins over the
    profile's ``ignore_configured_endpoint_urls``; only ``true`` in any case is true, as
    botocore reads it), with its source; ``None`` when neither says."""
    if IGNORE_VARIABLE in env:
        return Sourced(env[IGNORE_VARIABLE].lower() == "true", f"env {IGNORE_VARIABLE}")
    value = profile.values.get("ignore_configured_endpoint_urls")
    if value is None:
        return None
    return Sourced(str(value).strip().lower() == "true",
                   profile.where("ignore_configured_endpoint_urls"))


def aws_file(env: Mapping[str, str], which: str) -> str:
    """The AWS ``credentials`` or ``config`` file botocore reads, for messages."""
    var = "AWS_SHARED_CREDENTIALS_FILE" if which == "credentials" else "AWS_CONFIG_FILE"
    return env.get(var) or f"~/.aws/{which}"


def aws_files(env: Mapping[str, str]) -> str:
    """The AWS config and credentials files botocore reads, for messages."""
    return f"{aws_file(env, 'config')}, {aws_file(env, 'credentials')}"


def chain_source(method: str | None, profile: str | None, env: Mapping[str, str] | None = None) -> str:
    """Describe botocore's credential ``method`` as a source, naming the file."""
    env = os.environ if env is None else env
    name = profile or "default"
    if method == "shared-credentials-file":
        return f"{aws_file(env, 'credentials')} [profile {name}]"
    if method == "config-file":
        return f"{aws_file(env, 'config')} [profile {name}]"
    if method == "assume-role-with-web-identity" and env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return "env AWS_ROLE_ARN/AWS_WEB_IDENTITY_TOKEN_FILE (botocore assume-role-with-web-identity)"
    if method == "sso":
        return f"{aws_file(env, 'config')} [profile {name}] (botocore sso)"
    if (setting := _PROFILE_METHODS.get(method or "")) is not None:
        # "botocore custom-process" named neither the profile nor the file of a rejected key
        return f"{profile_setting_file(name, setting, env)} [profile {name}] {setting} " \
               f"(botocore {method})"
    return f"botocore {method or 'credential chain'}"


#: botocore's credential providers driven by one setting of a profile, and that setting.
_PROFILE_METHODS = {"custom-process": "credential_process", "assume-role": "role_arn",
                    "assume-role-with-web-identity": "web_identity_token_file"}
