"""Relays the `kubernetes` Service address (10.218.0.1:443) to the apiserver on 127.0.0.1.

There is no kube-proxy in the test cluster (pods find each other through headless-Service DNS),
but in-cluster clients such as the operator's Deployment connect to KUBERNETES_SERVICE_HOST:443.
The harness puts that ClusterIP on the pod bridge, and this process forwards its TCP connections
to the apiserver, byte for byte (TLS stays end to end: the apiserver certificate names the IP).
Run as `python -m tests.cluster.relay --state DIR`.
"""

from __future__ import annotations

import argparse
import socket
import threading
from pathlib import Path

from .layout import Layout


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _handle(client: socket.socket, upstream: tuple[str, int]) -> None:
    try:
        server = socket.create_connection(upstream, timeout=10)
    except OSError:
        client.close()
        return
    server.settimeout(None)
    t = threading.Thread(target=_pump, args=(server, client), daemon=True)
    t.start()
    _pump(client, server)
    t.join()
    client.close()
    server.close()


def serve(layout: Layout, port: int = 443) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((layout.kubernetes_service_ip, port))
    listener.listen(64)
    upstream = ("127.0.0.1", layout.apiserver_port)
    print(f"apiserver-relay: {layout.kubernetes_service_ip}:{port} -> {upstream[0]}:{upstream[1]}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_handle, args=(conn, upstream), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description="kubernetes Service relay for the rlkube test cluster")
    parser.add_argument("--state", required=True)
    serve(Layout(state=Path(parser.parse_args().state)))


if __name__ == "__main__":
    main()
