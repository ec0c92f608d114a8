"""Certificates and keys for the local control plane, made with the ``openssl`` CLI.

One CA signs every serving certificate (the API server's, and the operator webhook's that
tests hand to kopf); the service-account key pair signs and verifies ServiceAccount tokens.
Never kopf's own generator (it needs oscrypto, which cannot load OpenSSL 3).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from durable_producer.local.ports import LOOPBACK

VALIDITY_DAYS = 7
OPENSSL_TIMEOUT_SECONDS = 60
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


class OpensslMissing(RuntimeError):
    """The ``openssl`` command is not installed."""


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise OpensslMissing("the openssl command is needed for the local control plane's"
                             " certificates: apt-get install openssl")
    result = subprocess.run([openssl, *args], capture_output=True, text=True,
                            timeout=OPENSSL_TIMEOUT_SECONDS, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


@dataclass(frozen=True)
class KeyPair:
    certificate: Path
    key: Path


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA in ``directory`` (ca.crt, ca.key) that signs serving certificates."""

    directory: Path

    @property
    def certificate(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def key(self) -> Path:
        return self.directory / "ca.key"

    @classmethod
    def create(cls, directory: Path, common_name: str = "durable-producer-local-ca"
               ) -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        authority = cls(directory)
        _openssl("req", "-x509", *EC_KEY, "-nodes", "-days", str(VALIDITY_DAYS),
                 "-subj", f"/CN={common_name}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-keyout", str(authority.key), "-out", str(authority.certificate))
        return authority

    def serving_certificate(self, name: str, *, ips: tuple[str, ...] = (LOOPBACK,),
                            dns_names: tuple[str, ...] = ("localhost",)) -> KeyPair:
        """A server certificate ``<name>.crt``/``<name>.key`` for these addresses."""
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        request = self.directory / f"{name}.csr"
        extensions = self.directory / f"{name}.ext"
        names = [f"IP:{ip}" for ip in ips] + [f"DNS:{dns}" for dns in dns_names]
        extensions.write_text(
            f"subjectAltName={','.join(names)}\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
        )
        _openssl("req", *EC_KEY, "-nodes", "-subj", f"/CN={name}",
                 "-keyout", str(pair.key), "-out", str(request))
        _openssl("x509", "-req", "-in", str(request), "-CA", str(self.certificate),
                 "-CAkey", str(self.key), "-CAcreateserial", "-days", str(VALIDITY_DAYS),
                 "-extfile", str(extensions), "-out", str(pair.certificate))
        return pair


def service_account_keys(directory: Path) -> KeyPair:
    """The key pair that signs (private) and verifies (public) ServiceAccount tokens; the
    ``certificate`` field holds the public key."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", str(pair.key))
    _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.certificate))
    return pair
