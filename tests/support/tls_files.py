"""A client certificate and its key as PEM files, the key encrypted when a password is given
(made with ``trustme``, as the TLS material of the other tests)."""

from __future__ import annotations

from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization


def client_tls_files(directory: Path, password: str | None = None) -> tuple[Path, Path]:
    """(certificate, key) written to ``directory``; the key PKCS#8, encrypted with
    ``password`` when one is given."""
    issued = trustme.CA().issue_cert("app.clients.test")
    certificate, key_file = directory / "tls.crt", directory / "tls.key"
    issued.cert_chain_pems[0].write_to_path(str(certificate))
    key = serialization.load_pem_private_key(issued.private_key_pem.bytes(), None)
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password.encode())
    )
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )
    )
    return certificate, key_file
