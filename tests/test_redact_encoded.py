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

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.run import base_env, run_warmstart
from warmstart.redact import Redactor
from warmstart.secrets import MASK, encoded_forms

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


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=6, max_size=40),
    before=st.binary(max_size=7),
    after=st.binary(max_size=7),
    url_safe=st.booleans(),
    padded=st.booleans(),
)
def test_base64_that_holds_a_secret_at_any_offset_is_masked(secret, before, after, url_safe, padded):
    """Whatever bytes come before and after it (so at every offset in base64's 3-byte groups), in either
    alphabet, with or without padding, a secret inside base64 text is masked: the cores that gate decoding
    (secrets.base64_cores) are in every such run."""
    encode = base64.urlsafe_b64encode if url_safe else base64.b64encode
    run = encode(before + secret.encode() + after).decode()
    run = run if padded else run.rstrip("=")
    masked = Redactor([secret]).text(f"header: Basic {run} next")
    assert run not in masked and secret not in masked


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=6, max_size=40),
    before=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12),
    after=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12),
)
def test_every_spelling_is_masked_though_base64_ones_are_searched_only_behind_a_core(secret, before, after):
    """The base64 spellings of a secret are searched for only where the text holds one of its cores (a 1 MB
    line costs 3-4 ms less with two secrets set, issue 37). Every spelling must still pass that gate: each
    is masked wherever it stands, among any characters (the gate reads the text's UTF-8 bytes)."""
    redactor = Redactor([secret])
    for form in sorted(encoded_forms(secret)):
        masked = redactor.text(f"{before} {form} {after}")
        assert MASK in masked and (form not in masked or form in f"{before} {MASK} {after}"), form


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(st.characters(min_codepoint=32, max_codepoint=0x7E), min_size=1, max_size=24),
    words=st.lists(
        st.one_of(
            st.text(st.characters(min_codepoint=33, max_codepoint=0x7E), min_size=1, max_size=12),
            st.sampled_from(["SECRET", "B64", "URL", "BASIC"]),
        ),
        min_size=1,
        max_size=40,
    ),
    limit=st.integers(min_value=1, max_value=400),
)
def test_the_head_of_a_long_line_is_the_start_of_the_whole_line_redacted(secret, words, limit):
    """The log reader gets a long line's head redacted alone (Redactor.head: a 1 MB line costs what its head
    costs). Whatever stands at the cut (the secret with or without spaces in it, a short one masked only as a
    word, its base64, a URL's password, `user:secret` in Basic auth), the head is exactly how the whole line
    redacted begins: nothing of a secret that the whole line's redaction masks is left half in it."""
    spelled = {
        "SECRET": secret,
        "B64": base64.b64encode(secret.encode()).decode(),
        "URL": f"https://user:{urllib.parse.quote(secret, safe='')}@mirror.example/x",
        "BASIC": base64.b64encode(f"user:{secret}".encode()).decode(),
    }
    text = " ".join(spelled.get(w, w) for w in words)
    redactor = Redactor([secret])
    head = redactor.head(text, limit)
    assert len(head) <= limit and redactor.text(text).startswith(head)


def test_a_1_mb_config_line_decodes_no_run_that_cannot_hold_a_secret(monkeypatch):
    """A long config line is mostly short words of base64's alphabet (`'opt_12': True`). Each was decoded to
    look for a secret: 0.5-0.7 s for a 1 MB line with HF_TOKEN set, on the thread that drains vLLM's pipe
    (`bench rehearsal --long-line 1048576`, issue 37). Now a run is decoded only where the text holds a core
    of a secret's base64, and one that holds the secret's base64 is still masked in the same line."""
    from warmstart import redact
    from warmstart_dev.rehearsal import grown

    calls: list[str] = []
    decode = redact.decodes_to_secret
    monkeypatch.setattr(redact, "decodes_to_secret", lambda run, secrets: calls.append(run) or decode(run, secrets))
    line = grown("(EngineCore pid=1) INFO 12-01 10:00:18 [core.py:140] Initializing a V1 LLM engine", 1 << 20)
    redactor = Redactor.from_env({"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345", "VLLM_API_KEY": "sekret7"})
    assert redactor.text(line) == line and calls == []
    basic = base64.b64encode(b"user:sekret7").decode()
    assert basic not in redactor.text(line + f" Authorization: Basic {basic}") and calls == [basic]
