"""An HTTP server socket that answers on IPv4 and IPv6: the agent's and the operator's endpoints.

``::`` (the default of both) is one dual-stack socket (IPv6 with ``IPV6_V6ONLY`` off), so
kubelet probes and Prometheus reach it at the pod IP in IPv4-only, IPv6-only and dual-stack
clusters; on a kernel without IPv6 it binds ``0.0.0.0`` instead. Imports nothing from the
package: the agent and the operator both use it and must not import each other.
"""

from __future__ import annotations

import errno
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANY_ADDRESS_V6 = "::"
ANY_ADDRESS_V4 = "0.0.0.0"
# The kernel has no IPv6 (module absent or disabled): serve IPv4 only.
NO_IPV6_ERRNOS = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that answers in one call and logs nothing (probes come every few
    seconds: a log line each would flood the log)."""

    def answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _IPv6HTTPServer(ThreadingHTTPServer):
    """An IPv6 socket; bound to ``::`` it also takes IPv4 (IPV6_V6ONLY off: dual stack)."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        if self.server_address[0] == ANY_ADDRESS_V6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def http_server(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """An HTTP server on ``host``: ``::`` is every address of both families (one dual-stack
    socket), falling back to ``0.0.0.0`` on a kernel without IPv6; an IPv6 literal gets an
    IPv6 socket, anything else an IPv4 one."""
    if ":" not in host:
        return ThreadingHTTPServer((host, port), handler)
    try:
        return _IPv6HTTPServer((host, port), handler)
    except OSError as error:
        if host != ANY_ADDRESS_V6 or error.errno not in NO_IPV6_ERRNOS:
            raise
        return ThreadingHTTPServer((ANY_ADDRESS_V4, port), handler)
