"""Which tags go in an upload's ``x-amz-tagging`` header and which are set after it
(:mod:`tensorstream.providers.s3.tags`): the cut ``aws s3 cp`` makes, 2 KiB encoded."""

from __future__ import annotations

from urllib.parse import quote

from tensorstream.providers.s3.tags import TAGGING_HEADER_MAX, encode_tags, header_or_later


def test_a_tag_set_up_to_2_kib_encoded_goes_in_the_header_a_longer_one_after() -> None:
    fits = encode_tags([("k", "v" * (TAGGING_HEADER_MAX - 2))])
    assert len(fits) == TAGGING_HEADER_MAX
    fields = {"ContentType": "x/y", "Tagging": fits}
    assert header_or_later(fields) == (fields, [])
    over = encode_tags([("k", "v" * (TAGGING_HEADER_MAX - 1))])
    assert header_or_later({"ContentType": "x/y", "Tagging": over}) == (
        {"ContentType": "x/y"}, [{"Key": "k", "Value": "v" * (TAGGING_HEADER_MAX - 1)}])
    # Counted encoded: 300 characters of 'é' are 1,800 bytes in the header, over with
    # another 300; each tag read back as it was, '&', '=', '+', '%' and blank values too.
    tags = [("é" * 300, "a&b=c+d%e"), ("empty", ""), ("x y", "é" * 300)]
    tagging = encode_tags(tags)
    assert tagging.startswith(quote("é") * 300) and len(tagging) > TAGGING_HEADER_MAX
    assert header_or_later({"Tagging": tagging}) == (
        {}, [{"Key": k, "Value": v} for k, v in tags])
    assert header_or_later({"Metadata": {"a": "1"}}) == ({"Metadata": {"a": "1"}}, [])
