"""A local stand-in for the Hugging Face Hub's HTTP API, enough for `snapshot_download`.

It serves one repo (`/api/models/<repo>/revision/<rev>`, `/api/models/<repo>/tree/<commit>`
and `/<repo>/resolve/<commit>/<file>`, GET and HEAD) and records every request and every
Authorization header, so tests can prove that a download happens, that a complete snapshot
never asks, and (`make image-check`) that a build secret reached the Hub without reaching a layer.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class FakeHub:
    def __init__(self, repo_id: str, commit: str, files: dict[str, bytes]) -> None:
        self.repo_id = repo_id
        self.commit = commit
        self.files = files
        self.requests: list[tuple[str, str]] = []
        self.authorizations: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def reply(self, code: int, body: bytes, headers: dict[str, str], head: bool) -> None:
                self.send_response(code)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def serve(self, head: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path))
                if auth := self.headers.get("Authorization"):
                    hub.authorizations.append(auth)
                api = f"/api/models/{hub.repo_id}"
                as_json = {"Content-Type": "application/json"}
                if path.startswith(api + "/revision/"):
                    info = {"id": hub.repo_id, "sha": hub.commit, "siblings": [{"rfilename": n} for n in hub.files]}
                    return self.reply(200, json.dumps(info).encode(), as_json, head)
                if path.startswith(api + "/tree/"):
                    tree = [
                        {"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                        for n, d in hub.files.items()
                    ]
                    return self.reply(200, json.dumps(tree).encode(), as_json, head)
                prefix = f"/{hub.repo_id}/resolve/"
                if (
                    path.startswith(prefix)
                    and (data := hub.files.get(path[len(prefix) :].split("/", 1)[1])) is not None
                ):
                    headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
                    return self.reply(200, data, headers, head)
                return self.reply(404, b"{}", as_json, head)

            def do_GET(self) -> None:
                self.serve(head=False)

            def do_HEAD(self) -> None:
                self.serve(head=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
