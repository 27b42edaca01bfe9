"""The S3 client: boto3 with bounded timeouts and retries, and what its failures mean to a store.

boto3's credentials come from its standard chain (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, profiles), are never read, logged or stored here. Timeouts and retries are
bounded so that an unreachable endpoint costs a boot seconds. Every request goes through `call`,
which turns botocore's failures into the store's three: FileNotFoundError (no such object),
StoreUnavailable (nothing is known about the store: unreachable, refused, no bucket, throttling
or failing past its retries) and StoreError (this request failed).

Transient failures are retried by botocore's "standard" retry mode (throttling such as 503
SlowDown, 5xx, connection errors: exponential backoff with jitter, `MAX_ATTEMPTS` in all). A body
is read inside `call` too: botocore retries a request, not the read of its body, so a body cut
mid-read (or stalled past the read timeout) is fetched again here, as often, with the same
kind of backoff. What is still failing after that makes the tier unavailable: the boot goes
on from the next tier, or cold.
"""

from __future__ import annotations

import base64
import hashlib
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .bundle import StoreError, StoreUnavailable

GET_WORKERS = 8
PUT_WORKERS = 4
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 3  # the first try and two retries: a failing endpoint must not hold a boot for long
BACKOFF_S = 0.5  # a cut body's retries wait up to 0.5 s, then 1 s (with full jitter), like botocore's

UNREACHABLE = (
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ProxyConnectionError",
    "SSLError",
)
REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "403"}
MISSING = {"NoSuchKey", "404", "NotFound", "NoSuchUpload"}
TRANSIENT = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "500",
    "502",
    "503",
    "504",
}
BODY_ERRORS = ("ResponseStreamingError", "IncompleteReadError", "ReadTimeoutError", "ProtocolError")
PRECONDITION = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}


def make_client(
    endpoint_url: str | None,
    region: str | None,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> Any:
    """A boto3 S3 client with bounded timeouts and retries, path-style for custom endpoints.

    Checksums are computed only where an operation requires them: several S3-compatible
    stores reject the CRC trailers boto3 >= 1.36 adds by default. Integrity is ours anyway:
    Content-MD5 on every upload, the bundle's SHA-256 on every restore.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=GET_WORKERS + PUT_WORKERS + 4,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        s3={"addressing_style": "path"} if endpoint_url else {},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        code = str(error.get("Code", ""))
        status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return code or status
    return ""


def _status(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return ""


def precondition_failed(exc: BaseException) -> bool:
    """A conditional write (If-None-Match, If-Match) lost: the object was there, or changed."""
    return error_code(exc.__cause__ or exc) in PRECONDITION


def call(client: Any, bucket: str, operation: str, *, url: str, read: bool = False, **kwargs: Any) -> Any:
    """One S3 request; botocore's failures become FileNotFoundError, StoreUnavailable or StoreError.
    `url`: the store's, for the message that asks to check its credentials. With `read`, the
    response's body is read too, and the response is returned with the body's bytes as `Data`;
    a body cut mid-read is requested again, `MAX_ATTEMPTS` times in all."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        response = _call(client, bucket, operation, url=url, **kwargs)
        if not read:
            return response
        try:
            return {**response, "Data": response["Body"].read()}
        except Exception as exc:  # botocore's and urllib3's read errors, sorted below
            name = type(exc).__name__
            if name not in BODY_ERRORS and not isinstance(exc, (OSError, ConnectionError)):
                raise
            if attempt == MAX_ATTEMPTS:
                raise StoreUnavailable(f"S3 {operation}: the body was cut {MAX_ATTEMPTS} times ({name})") from exc
            time.sleep(random.uniform(0, BACKOFF_S * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")


def _call(client: Any, bucket: str, operation: str, *, url: str, **kwargs: Any) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        return getattr(client, operation)(Bucket=bucket, **kwargs)
    except ClientError as exc:
        code = error_code(exc)
        if code in MISSING or _status(exc) == "404":
            raise FileNotFoundError(kwargs.get("Key", "")) from exc
        if code in REFUSED or _status(exc) == "403":
            raise StoreUnavailable(f"S3 refused the request ({code}): check the credentials for {url}") from exc
        if code == "NoSuchBucket":
            raise StoreUnavailable(f"S3 bucket {bucket!r} does not exist") from exc
        if code in TRANSIENT or _status(exc) in TRANSIENT:
            raise StoreUnavailable(f"S3 {operation} failed {MAX_ATTEMPTS} times: {code or _status(exc)}") from exc
        raise StoreError(f"S3 {operation} failed: {code or exc}") from exc
    except NoCredentialsError as exc:
        raise StoreUnavailable("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") from exc
    except BotoCoreError as exc:
        if type(exc).__name__ in UNREACHABLE:
            raise StoreUnavailable(f"S3 endpoint unreachable: {type(exc).__name__}") from exc
        raise StoreUnavailable(f"S3 request failed: {type(exc).__name__}") from exc


_Range = TypeVar("_Range")


def in_order(fetch: Callable[[_Range], bytes], ranges: list[_Range], workers: int) -> Iterator[bytes]:
    """`fetch` each range, `workers` at a time, yielding the results in the ranges' order."""
    pending = iter(ranges)
    with ThreadPoolExecutor(max_workers=min(workers, len(ranges)), thread_name_prefix="s3-get") as pool:
        window = deque(pool.submit(fetch, span) for span in _take(pending, 2 * workers))
        try:
            while window:
                data = window.popleft().result()
                for span in _take(pending, 1):
                    window.append(pool.submit(fetch, span))
                yield data
        finally:
            for future in window:
                future.cancel()


def _take(it: Iterator[_Range], n: int) -> list[_Range]:
    out = []
    for _ in range(n):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


def content_md5(data: bytes | memoryview) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()
