"""Fixtures of the S3 tests: a moto S3 server for the module and the credentials that reach it."""

from __future__ import annotations

import pytest

from helpers.s3_server import ACCESS_KEY, SECRET_KEY, moto_server


@pytest.fixture(scope="module")
def endpoint() -> str:
    with moto_server() as url:
        yield url


@pytest.fixture
def aws_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
