"""S3 and endpoint URLs, checked: the ground floor that settings and the S3 store both stand on.

Settings checks `WARMSTART_S3_URL` and `WARMSTART_S3_ENDPOINT_URL` before anything slow
happens, and the S3 store addresses its objects with the parsed URL. Both need the same
rules, and neither may import the other (settings must not pull in the store, and boto3
with it), so the rules live here and import nothing from warmstart.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket's root

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel


def is_s3_model(name: str | None) -> bool:
    """MODEL_NAME (or TOKENIZER) names a prefix in S3-compatible storage (s3model.py reads it)."""
    return bool(name) and name.lower().startswith("s3://")  # type: ignore[union-attr]


def parse_s3_url(raw: str) -> S3Url:
    """`s3://bucket/prefix` -> S3Url. Raises ValueError with the reason."""
    parsed = urlparse(raw)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError("expected s3://BUCKET/PREFIX")
    if "@" in parsed.netloc or parsed.query or parsed.fragment:
        raise ValueError("a bucket name only: no credentials, query or fragment in the URL")
    prefix = parsed.path.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError("the prefix must not contain empty, '.' or '..' parts")
    return S3Url(parsed.netloc, prefix)


def check_endpoint_url(raw: str) -> None:
    """An S3-compatible endpoint: http(s)://HOST[:PORT], without credentials. Raises ValueError."""
    parsed = urlparse(raw)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError("expected http(s)://HOST[:PORT]")
    if parsed.username or parsed.password:
        raise ValueError("must not carry credentials (use AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
