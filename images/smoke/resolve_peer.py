"""Smoke check between two pods: resolve the peer's DNS name, then talk to it over TCP.

Each pod listens on PORT and, in a loop, resolves PEER (a headless-Service name such as
`peer-1.peers`) and sends it its own name. It exits 0 once it has both reached the peer and been
reached by it, so neither pod can leave before the other has resolved it (a finished pod drops
out of its Service's endpoints). Exits 1 after DEADLINE_S.
"""

import os
import socket
import sys
import threading
import time

peer = os.environ["PEER"]
me = socket.gethostname()
port = int(os.environ.get("PORT", "7000"))
deadline = time.monotonic() + float(os.environ.get("DEADLINE_S", "90"))
heard_from = threading.Event()


def listen() -> None:
    server = socket.create_server(("0.0.0.0", port))
    while True:
        conn, addr = server.accept()
        with conn:
            msg = conn.recv(256).decode(errors="replace")
            print(f"{me}: heard '{msg}' from {addr[0]}", flush=True)
            heard_from.set()


threading.Thread(target=listen, daemon=True).start()
reached, last_error = None, "not tried"
while time.monotonic() < deadline:
    if reached is None:
        try:
            addr = socket.gethostbyname(peer)
            with socket.create_connection((addr, port), timeout=2) as conn:
                conn.sendall(me.encode())
            reached = addr
            print(f"{me}: {peer} -> {addr}, connected", flush=True)
        except OSError as err:
            last_error = f"{type(err).__name__}: {err}"
    if reached and heard_from.is_set():
        sys.exit(0)
    time.sleep(0.2)
print(f"{me}: gave up; reached={reached} heard_from={heard_from.is_set()} last error: {last_error}",
      file=sys.stderr, flush=True)
sys.exit(1)
