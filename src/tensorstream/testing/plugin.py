"""pytest plugin: mocked S3, HTTP and Redis backends as fixtures (see docs/testing.md)."""
