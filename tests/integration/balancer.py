"""A real load balancer in front of cloud replicas: Debian's nginx, started for a test (skipped without it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from fl_services.fedctl.redis_server import free_port

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)

_CONFIG = """
{user}
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log {dir}/access.log;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  client_max_body_size 0;
  upstream cloud {{
{servers}
    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://cloud;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      # Long-polls and the dashboard's event stream: no buffering, and longer than any poll.
      proxy_buffering off;
      proxy_read_timeout 120s;
      proxy_connect_timeout 2s;
      # A replica that is gone: the request goes to another one. Contributions too (non_idempotent): each
      # carries its idempotency key, so one the dead replica had taken is counted once.
      proxy_next_upstream error timeout http_502 non_idempotent;
    }}
  }}
}}
"""


class Nginx:
    def __init__(self, workdir: Path):
        self.dir = Path(workdir)
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, upstreams: list[str]) -> str:
        """Balances over `upstreams` (http://host:port); returns the balancer's own address."""
        if NGINX is None:
            raise RuntimeError("nginx is not installed")
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        servers = "\n".join(f"    server {u.removeprefix('http://')} max_fails=1 fail_timeout=5s;" for u in upstreams)
        # As root, nginx's workers would run as nobody, who cannot enter the test's private directories.
        user = "user root;" if os.geteuid() == 0 else ""
        conf = self.dir / "nginx.conf"
        conf.write_text(_CONFIG.format(user=user, dir=self.dir, servers=servers, port=port))
        self.log = open(self.dir / "nginx.out", "ab")
        self.proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(self.dir)], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {(self.dir / 'error.log').read_text(errors='replace')}")
            try:
                # 200 only: nginx answers 502 itself while no upstream does.
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("nginx did not answer within 20 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
