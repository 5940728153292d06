"""botocore's credential chain (level 5 of :mod:`.config`'s order), run synchronously:
what it finds, and which file or mechanism to name as the source of a key."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...credentials.base import Sourced
from .process import DEFAULT_CREDENTIAL_PROCESS_TIMEOUT, bound_credential_process
from .profile import aws_file, aws_files, chain_source, config_profile_name

if TYPE_CHECKING:
    from .config import S3Credentials

__all__ = ["botocore_region", "chain_source", "resolve_botocore_chain"]  # chain_source: profile's


def resolve_botocore_chain(
    creds: S3Credentials, process_timeout: float = DEFAULT_CREDENTIAL_PROCESS_TIMEOUT,
) -> tuple[Sourced[str], Sourced[str], Sourced[str] | None] | None:
    """Run botocore's chain synchronously (level 5). ``None`` if it finds nothing.

    May contact instance metadata unless ``AWS_EC2_METADATA_DISABLED=true``; a
    ``credential_process`` is stopped after ``process_timeout`` seconds.
    """
    import botocore.exceptions
    import botocore.session

    profile = creds.profile.value if creds.profile else None
    session = botocore.session.Session(profile=profile)
    try:
        bound_credential_process(session, process_timeout)
        found = session.get_credentials()
        # refreshable credentials are fetched (or refreshed, and found expired) here
        frozen = found.get_frozen_credentials() if found is not None else None
    except Exception as exc:
        from .errors import map_session_error  # botocore's exceptions: only on this path

        mapped = map_session_error(exc, profile, aws_files(os.environ),
                                   creds.profile.source if creds.profile else "")
        if mapped is exc:
            raise
        raise mapped from exc
    if found is None or frozen is None:
        return None
    source = chain_source(getattr(found, "method", None), profile)
    token = Sourced(frozen.token, source, secret=True) if frozen.token else None
    return (Sourced(frozen.access_key, source, secret=True),
            Sourced(frozen.secret_key, source, secret=True), token)


def botocore_region(creds: S3Credentials) -> Sourced[str] | None:
    """The region botocore would take from the profile's config, if any."""
    import botocore.session

    profile = creds.profile.value if creds.profile else None
    try:
        region = botocore.session.Session(profile=profile).get_config_variable("region")
    except Exception:
        return None
    if not region:
        return None
    # botocore reads AWS_PROFILE's section even where the keys came from variables
    name = config_profile_name(profile, os.environ)
    return Sourced(str(region), f"{aws_file(os.environ, 'config')} [profile {name}] region")
