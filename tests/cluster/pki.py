"""The cluster's certificates and keys, made with the openssl command line.

One CA signs every serving and client certificate (ECDSA P-256: fast to make on a busy
machine); the service-account signing key is RSA because every Kubernetes token verifier
accepts RS256. Client identities follow the built-in RBAC roles: `system:masters` for the
admin, `system:kube-controller-manager`, `system:kube-scheduler`, and `system:node:<name>` in
`system:nodes` for each kubelet.
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "3650"


@dataclass(frozen=True)
class Identity:
    """A certificate to issue: file stem, subject, and for serving certs the alternative names."""

    stem: str
    common_name: str
    organization: str | None = None
    hosts: tuple[str, ...] = ()  # DNS names or IPs; non-empty makes it a serving certificate


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def _subject(ident: Identity) -> str:
    return f"/CN={ident.common_name}" + (f"/O={ident.organization}" if ident.organization else "")


def ensure_ca(pki: Path) -> None:
    if (pki / "ca.crt").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(pki / "ca.key"))
    _openssl(
        "req", "-x509", "-new", "-key", str(pki / "ca.key"), "-days", DAYS, "-subj", "/CN=rlkube-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out", str(pki / "ca.crt"),
    )  # fmt: skip


def issue(pki: Path, ident: Identity) -> tuple[Path, Path]:
    """Issue (once) a certificate signed by the cluster CA; returns (cert, key) paths."""
    crt, key = pki / f"{ident.stem}.crt", pki / f"{ident.stem}.key"
    if crt.exists() and key.exists():
        return crt, key
    ensure_ca(pki)
    csr, ext = pki / f"{ident.stem}.csr", pki / f"{ident.stem}.ext"
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
    _openssl("req", "-new", "-key", str(key), "-subj", _subject(ident), "-out", str(csr))
    lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if ident.hosts:
        lines.append("extendedKeyUsage=serverAuth,clientAuth")
        lines.append("subjectAltName=" + ",".join(_alt_name(h) for h in ident.hosts))
    else:
        lines.append("extendedKeyUsage=clientAuth")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-CAcreateserial", "-days", DAYS, "-extfile", str(ext), "-out", str(crt),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    return crt, key


def service_account_keys(pki: Path) -> tuple[Path, Path]:
    """(private, public) RSA key files the apiserver signs and checks service-account tokens with."""
    priv, pub = pki / "sa.key", pki / "sa.pub"
    if not priv.exists():
        pki.mkdir(parents=True, exist_ok=True)
        _openssl("genrsa", "-out", str(priv), "2048")
        _openssl("rsa", "-in", str(priv), "-pubout", "-out", str(pub))
    return priv, pub


def _alt_name(host: str) -> str:
    try:
        ipaddress.ip_address(host)
        return f"IP:{host}"
    except ValueError:
        return f"DNS:{host}"
