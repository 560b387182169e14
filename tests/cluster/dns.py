"""Cluster DNS: a small authoritative DNS server for `<cluster domain>` fed by the API.

It answers A queries for
  `<service>.<namespace>.svc.<domain>`           -> the ClusterIP, or for a headless Service
                                                    the addresses of its ready endpoints
  `<hostname>.<service>.<namespace>.svc.<domain>` -> that endpoint (pods with `hostname` and
                                                    `subdomain` set, as StatefulSets and
                                                    rendezvous Services use)
from Services and EndpointSlices, re-listed every second, which is what the tests need from
CoreDNS. Names outside the cluster domain get NXDOMAIN: nothing is forwarded off the machine.
Run by the harness as `python -m tests.cluster.dns --state DIR`; it listens on the pod bridge.
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time
from pathlib import Path

from .api import Client
from .layout import Layout

TYPE_A, TYPE_ANY = 1, 255
RCODE_OK, RCODE_FORMERR, RCODE_NXDOMAIN = 0, 1, 3
TTL = 1  # records change as pods come and go; clients should ask again


def records_from(services: list[dict], slices: list[dict], domain: str) -> dict[str, list[str]]:
    """Map of lower-case fully-qualified names (no trailing dot) to IPv4 addresses."""
    records: dict[str, list[str]] = {}
    headless: dict[tuple[str, str], bool] = {}
    for svc in services:
        meta, spec = svc["metadata"], svc.get("spec", {})
        fqdn = f"{meta['name']}.{meta['namespace']}.svc.{domain}".lower()
        ip = spec.get("clusterIP")
        if ip and ip != "None":
            records[fqdn] = [ip]
        else:
            headless[(meta["namespace"], meta["name"])] = True
            records.setdefault(fqdn, [])
    for sl in slices:
        meta = sl["metadata"]
        svc_name = meta.get("labels", {}).get("kubernetes.io/service-name")
        if not svc_name or (meta["namespace"], svc_name) not in headless or sl.get("addressType") != "IPv4":
            continue
        base = f"{svc_name}.{meta['namespace']}.svc.{domain}".lower()
        for ep in sl.get("endpoints") or []:
            # The EndpointSlice controller already marks not-ready pods ready when the Service
            # publishes not-ready addresses, so `ready` is the one test.
            if ep.get("conditions", {}).get("ready") is False:
                continue
            addrs = ep.get("addresses") or []
            records[base] = sorted(set(records.get(base, [])) | set(addrs))
            if ep.get("hostname"):
                records[f"{ep['hostname']}.{base}".lower()] = list(addrs)
    return records


def parse_query(packet: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end offset of the question) of a one-question query."""
    if len(packet) < 12:
        raise ValueError("short packet")
    qid, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        raise ValueError("expected one question")
    labels, pos = [], 12
    while True:
        length = packet[pos]
        pos += 1
        if length == 0:
            break
        if length & 0xC0:
            raise ValueError("compressed question name")
        labels.append(packet[pos : pos + length].decode("ascii", "replace"))
        pos += length
    qtype, _qclass = struct.unpack("!HH", packet[pos : pos + 4])
    return qid, flags, ".".join(labels), qtype, pos + 4


def answer(packet: bytes, records: dict[str, list[str]], domain: str) -> bytes:
    try:
        qid, flags, name, qtype, end = parse_query(packet)
    except (ValueError, IndexError, struct.error):
        qid = struct.unpack("!H", packet[:2])[0] if len(packet) >= 2 else 0
        return struct.pack("!HHHHHH", qid, 0x8000 | RCODE_FORMERR, 0, 0, 0, 0)
    key = name.lower().rstrip(".")
    addrs = records.get(key)
    rcode = RCODE_OK if addrs is not None else RCODE_NXDOMAIN
    answers = addrs if addrs and qtype in (TYPE_A, TYPE_ANY) else []
    # QR, authoritative, keep the client's RD bit; no recursion offered.
    out_flags = 0x8000 | 0x0400 | (flags & 0x0100) | rcode
    header = struct.pack("!HHHHHH", qid, out_flags, 1, len(answers), 0, 0)
    body = b"".join(
        struct.pack("!HHHIH", 0xC00C, TYPE_A, 1, TTL, 4) + socket.inet_aton(ip) for ip in answers
    )
    return header + packet[12:end] + body


class Records:
    """The current record set, refreshed from the API on a thread."""

    def __init__(self, client: Client, domain: str, interval: float = 1.0):
        self.client, self.domain, self.interval = client, domain, interval
        self.current: dict[str, list[str]] = {}
        self.synced = threading.Event()

    def refresh(self) -> None:
        services = self.client.get("/api/v1/services")["items"]
        slices = self.client.get("/apis/discovery.k8s.io/v1/endpointslices")["items"]
        self.current = records_from(services, slices, self.domain)
        self.synced.set()

    def run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception as err:  # noqa: BLE001 - keep serving the last good set
                print(f"cluster-dns: refresh failed: {err}", flush=True)
            time.sleep(self.interval)


def serve(layout: Layout) -> None:
    p = layout.pki
    client = Client(layout.server, p / "ca.crt", p / "admin.crt", p / "admin.key", timeout=5)
    records = Records(client, layout.cluster_domain)
    threading.Thread(target=records.run, daemon=True).start()
    records.synced.wait(30)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((layout.bridge_ip, 53))
    print(f"cluster-dns: serving {layout.cluster_domain} on {layout.bridge_ip}:53", flush=True)
    while True:
        packet, addr = sock.recvfrom(4096)
        sock.sendto(answer(packet, records.current, layout.cluster_domain), addr)


def main() -> None:
    parser = argparse.ArgumentParser(description="cluster DNS for the rlkube test cluster")
    parser.add_argument("--state", required=True)
    serve(Layout(state=Path(parser.parse_args().state)))


if __name__ == "__main__":
    main()
