#!/usr/bin/env python3
"""hub.py: a stand-in for the Hugging Face hub's URL shapes, for test_pull.sh.

    hub.py ROOT LOG PORT_FILE [--cut BYTES]

Serves the files under ROOT/OWNER/REPO/ on 127.0.0.1 (a free port, written
to PORT_FILE):
  GET  /api/models/OWNER/REPO            {"id", "siblings": [{"rfilename"}]}
  HEAD, GET /OWNER/REPO/resolve/main/PATH
       302 to http://localhost:PORT/cdn/OWNER/REPO/PATH (another host name,
       as the hub sends LFS files to its CDN), with X-Linked-Size and
       X-Linked-Etag (the file's SHA-256, quoted) and X-Repo-Commit
  GET  /cdn/OWNER/REPO/PATH              the bytes; "Range: bytes=N-" gives 206
Repository owner/bad states a wrong SHA-256; owner/private answers 401
without "Authorization: Bearer s3cret". With --cut, the first GET of each
file's bytes announces the whole length and closes the connection after
BYTES. Each request is logged to LOG as "METHOD PATH range=R auth=A".
"""
import hashlib
import http.server
import json
import os
import sys
import threading

root, log_path, port_file = sys.argv[1:4]
cut = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--cut" else 0
cut_done = set()
lock = threading.Lock()
TOKEN = "Bearer s3cret"


class Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def note(self):
        with lock, open(log_path, "a") as f:
            f.write(f"{self.command} {self.path} range={self.headers.get('Range', '-')} "
                    f"auth={self.headers.get('Authorization', '-')}\n")

    def answer(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def repo_dir(self, owner, repo):
        d = os.path.join(root, owner, repo)
        return d if os.path.isdir(d) else None

    def allowed(self, owner, repo):
        return f"{owner}/{repo}" != "owner/private" or self.headers.get("Authorization") == TOKEN

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self.note()
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 4:
            return self.listing(*parts[2:4])
        if len(parts) >= 5 and parts[2:4] == ["resolve", "main"]:
            return self.resolve(parts[0], parts[1], "/".join(parts[4:]))
        if parts[0] == "cdn" and len(parts) >= 4:
            return self.content(parts[1], parts[2], "/".join(parts[3:]))
        self.answer(404, b"not found")

    def listing(self, owner, repo):
        d = self.repo_dir(owner, repo)
        if not d:
            return self.answer(404, b'{"error": "Repository not found"}')
        if not self.allowed(owner, repo):
            return self.answer(401, b'{"error": "Invalid credentials"}')
        files = sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs)
        body = json.dumps({"id": f"{owner}/{repo}", "siblings": [{"rfilename": f} for f in files]}).encode()
        self.answer(200, body, [("Content-Type", "application/json")])

    def resolve(self, owner, repo, path):
        d = self.repo_dir(owner, repo)
        f = os.path.join(d, path) if d else None
        if not f or not os.path.isfile(f):
            return self.answer(404, b"Entry not found")
        if not self.allowed(owner, repo):
            return self.answer(401, b"Invalid credentials")
        data = open(f, "rb").read()
        sha = hashlib.sha256(data + (b"x" if owner == "owner" and repo == "bad" else b"")).hexdigest()
        port = self.server.server_address[1]
        self.answer(302, b"", [("Location", f"http://localhost:{port}/cdn/{owner}/{repo}/{path}"),
                               ("X-Linked-Size", str(len(data))), ("X-Linked-Etag", f'"{sha}"'),
                               ("X-Repo-Commit", "0" * 40)])

    def content(self, owner, repo, path):
        d = self.repo_dir(owner, repo)
        f = os.path.join(d, path) if d else None
        if not f or not os.path.isfile(f):
            return self.answer(404, b"not found")
        data = open(f, "rb").read()
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= len(data):
                return self.answer(416, b"", [("Content-Range", f"bytes */{len(data)}")])
        key = f"{owner}/{repo}/{path}"
        with lock:
            cutting = cut > 0 and key not in cut_done
            cut_done.add(key)
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if cutting:
            self.wfile.write(data[start:start + cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(data[start:])


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
