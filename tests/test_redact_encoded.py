"""A secret is masked in every spelling it is printed in, not only its literal one (issue 30, finding 3).

The literal-only redactor let through a token percent-encoded in a URL's userinfo (warmstart's own
"the Hub at {HF_ENDPOINT} sent nothing" line prints a mirror's URL), base64 in a Basic auth header,
JSON-escaped with `\\/`, and any API key shorter than 6 characters.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
import urllib.parse

from helpers.run import base_env, run_warmstart
from warmstart.redact import Redactor
from warmstart.secrets import MASK

TOKEN = "hf_Xq7/Lm+9zR=Tk2wPd"  # a token with the characters encoders change: / + =
SHORT_KEY = "k9x4"


def forms_of(secret: str) -> list[str]:
    return [
        urllib.parse.quote(secret, safe=""),
        re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), urllib.parse.quote(secret, safe="")),
        json.dumps(secret).replace("/", "\\/")[1:-1],
        base64.b64encode(secret.encode()).decode(),
        base64.urlsafe_b64encode(secret.encode()).decode().rstrip("="),
    ]


def test_every_spelling_of_a_known_secret_is_masked():
    redactor = Redactor.from_env({"HF_TOKEN": TOKEN})
    for form in forms_of(TOKEN):
        line = f"GET https://mirror.example/api?token={form} failed"
        assert form not in redactor.text(line) and MASK in redactor.text(line), form
    basic = base64.b64encode(f"mirror-user:{TOKEN}".encode()).decode()
    assert redactor.text(f"Authorization: Basic {basic}") == f"Authorization: Basic {MASK}"
    assert TOKEN[3:9] not in redactor.text(json.dumps({"token": TOKEN}).replace("/", "\\/"))


def test_a_urls_password_is_masked_even_when_its_value_is_not_known():
    redactor = Redactor()
    line = "the Hub at https://someone:n0t-a-kn0wn-value@mirror.example:8443/hf sent nothing"
    assert redactor.text(line) == f"the Hub at https://someone:{MASK}@mirror.example:8443/hf sent nothing"
    path = "see https://mirror.example/a:b@c"  # a path, no userinfo
    assert redactor.text(path) == path


def test_a_short_api_key_is_masked_where_it_stands_alone():
    redactor = Redactor.from_env({"VLLM_API_KEY": SHORT_KEY})
    line = f"non-default args: {{'api_key': ['{SHORT_KEY}']}}"
    assert redactor.text(line) == f"non-default args: {{'api_key': ['{MASK}']}}"
    assert redactor.text(f"--api-key={SHORT_KEY} x") == f"--api-key={MASK} x"
    assert redactor.text(f"model{SHORT_KEY}suffix and k9x45") == f"model{SHORT_KEY}suffix and k9x45"  # inside words


def test_the_hub_line_of_a_mirror_with_credentials_masks_them(tmp_path, volume, fake_vllm_python):
    """Real: a mirror that accepts and never answers, reached through HF_ENDPOINT with the token in
    its userinfo, percent-encoded as a URL needs it; warmstart's own error line printed it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    endpoint = f"http://mirror-user:{urllib.parse.quote(TOKEN, safe='')}@127.0.0.1:{port}"
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        MODEL_NAME="someorg/not-cached",
        HF_ENDPOINT=endpoint,
        HF_TOKEN=TOKEN,
        WARMSTART_HUB_TIMEOUT_S="2",
    )
    try:
        result = run_warmstart(["boot", "--json"], env, timeout=120)
    finally:
        server.close()
        for conn in accepted:
            conn.close()
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if "| error" in x]
    assert f"the Hub at http://mirror-user:{MASK}@127.0.0.1:{port} sent nothing" in line
    for form in [TOKEN, *forms_of(TOKEN)]:
        assert form not in result.stderr + result.stdout
