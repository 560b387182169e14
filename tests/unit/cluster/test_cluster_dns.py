"""The harness's DNS server: records from Services/EndpointSlices and the wire format."""

import socket
import struct

from tests.cluster.dns import RCODE_NXDOMAIN, TYPE_A, answer, parse_query, records_from

DOMAIN = "cluster.local"


def query(name: str, qtype: int = TYPE_A, qid: int = 0x1234) -> bytes:
    q = b"".join(bytes([len(part)]) + part.encode() for part in name.rstrip(".").split(".")) + b"\0"
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + q + struct.pack("!HH", qtype, 1)


def svc(name, ns, cluster_ip="None"):
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"clusterIP": cluster_ip}}


def endpoint_slice(svc_name, ns, endpoints):
    return {
        "metadata": {"namespace": ns, "labels": {"kubernetes.io/service-name": svc_name}},
        "addressType": "IPv4",
        "endpoints": endpoints,
    }


def test_headless_service_names_ready_endpoints_and_hostnames():
    records = records_from(
        [svc("peers", "ns1"), svc("api", "ns1", "10.218.0.7")],
        [endpoint_slice("peers", "ns1", [
            {"addresses": ["10.217.1.2"], "hostname": "peer-0", "conditions": {"ready": True}},
            {"addresses": ["10.217.2.2"], "hostname": "peer-1", "conditions": {"ready": True}},
            {"addresses": ["10.217.2.9"], "hostname": "gone", "conditions": {"ready": False}},
        ])],
        DOMAIN,
    )  # fmt: skip
    assert records["peers.ns1.svc.cluster.local"] == ["10.217.1.2", "10.217.2.2"]
    assert records["peer-1.peers.ns1.svc.cluster.local"] == ["10.217.2.2"]
    assert "gone.peers.ns1.svc.cluster.local" not in records
    assert records["api.ns1.svc.cluster.local"] == ["10.218.0.7"]


def test_slices_of_a_clusterip_service_do_not_replace_its_ip():
    records = records_from(
        [svc("api", "ns1", "10.218.0.7")],
        [endpoint_slice("api", "ns1", [{"addresses": ["10.217.1.5"], "hostname": "x"}])],
        DOMAIN,
    )
    assert records == {"api.ns1.svc.cluster.local": ["10.218.0.7"]}


def test_answer_carries_a_records_for_a_known_name():
    pkt = answer(query("Peer-0.peers.ns1.svc.cluster.local."), {"peer-0.peers.ns1.svc.cluster.local": ["10.217.1.2"]}, DOMAIN)
    qid, flags, qd, an, _, _ = struct.unpack("!HHHHHH", pkt[:12])
    assert (qid, flags & 0x8000, flags & 0xF, qd, an) == (0x1234, 0x8000, 0, 1, 1)
    assert pkt[-4:] == socket.inet_aton("10.217.1.2")


def test_unknown_name_is_nxdomain_and_aaaa_of_known_name_is_empty():
    records = {"a.b.svc.cluster.local": ["10.217.1.2"]}
    nx = answer(query("nope.b.svc.cluster.local"), records, DOMAIN)
    assert struct.unpack("!H", nx[2:4])[0] & 0xF == RCODE_NXDOMAIN
    aaaa = answer(query("a.b.svc.cluster.local", qtype=28), records, DOMAIN)
    flags, _, ancount = struct.unpack("!HHH", aaaa[2:8])
    assert flags & 0xF == 0 and ancount == 0


def test_parse_query_round_trip():
    qid, _, name, qtype, end = parse_query(query("x.y.svc.cluster.local", qtype=TYPE_A, qid=7))
    assert (qid, name, qtype) == (7, "x.y.svc.cluster.local", TYPE_A)
    assert end == len(query("x.y.svc.cluster.local"))
