"""Test credentials for the S3 server the tests start (warmstart_dev.s3server: moto on loopback)."""

from __future__ import annotations

from warmstart_dev.s3server import moto_server

__all__ = ["ACCESS_KEY", "SECRET_KEY", "moto_server", "s3_env"]

# Any credentials do for moto without authentication; these are what the tests set.
ACCESS_KEY = "AKIAWARMSTARTTEST0001"
SECRET_KEY = "warmstart-test-secret-value-0123456789"


def s3_env(endpoint: str) -> dict[str, str]:
    """The standard AWS variables a worker gets, pointing at the test server."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "WARMSTART_S3_ENDPOINT_URL": endpoint,
    }
