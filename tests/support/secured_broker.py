"""A single Apache Kafka broker with SASL listeners and an ACL authorizer, for the agent's own
Kafka client (the forwarder) against real authentication and authorization.

Listeners besides the plaintext ``CLIENT`` one (the test's own admin work, anonymous and a
super user there):

- ``SASLPLAIN``: SASL_PLAINTEXT; ``SASLTLS``: SASL_SSL with a certificate for 127.0.0.1 signed
  by a CA made for this broker (``ca_file``, made with ``trustme``); ``MTLS``: SSL with client
  certificates required, the principal being the certificate's CN (``client_files(user)``
  gives a user's certificate and key, signed by the same CA).
- Mechanisms PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 on both; every user in ``USERS`` has the
  same password for each (PLAIN from the JAAS config, SCRAM credentials stored in KRaft's
  metadata with AlterUserScramCredentials once the broker is up).
- ``StandardAuthorizer``: users may do only what ``allow`` grants them (no ACL: refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trustme
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported, not in its stubs
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)
from cryptography.hazmat.primitives import serialization

from durable_producer.local.broker import KafkaBroker
from durable_producer.local.kafka_node import JVM_OPTIONS
from durable_producer.local.ports import LOOPBACK, free_port

USERS = {"writer": "writer-secret"}
"""User -> password (every mechanism)."""
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
LISTENERS = {"SASLPLAIN": "SASL_PLAINTEXT", "SASLTLS": "SASL_SSL", "MTLS": "SSL"}
"""Listener name -> security protocol."""
_JAAS_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
_JAAS_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


class SecuredBroker(KafkaBroker):
    """The broker; ``bootstrap_for(protocol)`` is where a client of that protocol connects,
    ``bootstrap`` (plaintext, anonymous super user) is for the test's own admin work."""

    def __init__(self, jvm_options: Sequence[str] = JVM_OPTIONS) -> None:
        self.ports = {name: free_port() for name in LISTENERS}
        super().__init__(jvm_options=jvm_options)
        self.ca_file = self.work_dir / "tls" / "ca.pem"

    def client_files(self, user: str) -> tuple[Path, Path]:
        """(certificate, key) of ``user`` for the MTLS listener."""
        return self.work_dir / "tls" / f"{user}.pem", self.work_dir / "tls" / f"{user}.key"

    def bootstrap_for(self, protocol: str) -> str:
        name = next(name for name, value in LISTENERS.items() if value == protocol)
        return f"{LOOPBACK}:{self.ports[name]}"

    def server_properties(self) -> dict[str, str]:
        settings = super().server_properties()
        tls = self.work_dir / "tls"
        plain_users = " ".join(f'user_{user}="{password}"' for user, password in USERS.items())
        for name, protocol in LISTENERS.items():
            address = f"{LOOPBACK}:{self.ports[name]}"
            settings["listeners"] += f",{name}://{address}"
            settings["advertised.listeners"] += f",{name}://{address}"
            settings["listener.security.protocol.map"] += f",{name}:{protocol}"
            prefix = f"listener.name.{name.lower()}"
            if protocol in ("SSL", "SASL_SSL"):
                settings[f"{prefix}.ssl.keystore.type"] = "PEM"
                settings[f"{prefix}.ssl.keystore.location"] = str(tls / "server.pem")
            if protocol == "SSL":
                settings[f"{prefix}.ssl.client.auth"] = "required"
                settings[f"{prefix}.ssl.truststore.type"] = "PEM"
                settings[f"{prefix}.ssl.truststore.location"] = str(tls / "ca.pem")
                continue
            settings[f"{prefix}.plain.sasl.jaas.config"] = _JAAS_PLAIN.format(users=plain_users)
            for mechanism in MECHANISMS[1:]:
                settings[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = _JAAS_SCRAM
        settings.update(
            {
                "sasl.enabled.mechanisms": ",".join(MECHANISMS),
                "ssl.principal.mapping.rules": "RULE:^.*CN=([^,]+).*$/$1/,DEFAULT",
                "authorizer.class.name": (
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                ),
                "super.users": "User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
            }
        )
        return settings

    def format(self) -> None:
        self._make_certificates(self.work_dir / "tls")
        super().format()

    def start(self, timeout: float | None = None) -> SecuredBroker:
        super().start(timeout)
        try:
            self.add_scram_users(USERS)
        except BaseException:  # a start that fails leaves nothing running
            self.close()
            raise
        return self

    def add_scram_users(self, users: dict[str, str]) -> None:
        """SCRAM-SHA-256 and -512 credentials for ``users`` (name -> password); PLAIN and
        client certificates are for ``USERS`` only."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})
        for mechanism in MECHANISMS[1:]:  # one credential of a user a request
            info = ScramCredentialInfo(getattr(ScramMechanism, mechanism.replace("-", "_")), 4096)
            upserts: list[UserScramCredentialAlteration] = [
                UserScramCredentialUpsertion(user, info, password.encode())
                for user, password in users.items()
            ]
            for future in admin.alter_user_scram_credentials(upserts).values():
                future.result(timeout=30)

    def allow(self, user: str, topic: str, operations: list[str]) -> None:
        """Let ``user`` do ``operations`` (AclOperation names: WRITE, DESCRIBE, READ, ...) on
        ``topic``."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})
        bindings = [
            AclBinding(
                ResourceType.TOPIC,
                topic,
                ResourcePatternType.LITERAL,
                f"User:{user}",
                "*",
                getattr(AclOperation, operation),
                AclPermissionType.ALLOW,
            )
            for operation in operations
        ]
        for future in admin.create_acls(bindings).values():
            future.result(timeout=30)

    @staticmethod
    def _make_certificates(directory: Path) -> None:
        """A CA (``ca.pem``), and a certificate for 127.0.0.1 it signed: ``server.pem`` holds
        the key (PKCS#8, as Kafka's PEM keystore reads it) and the certificate chain."""
        if (directory / "server.pem").is_file():
            return
        directory.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA(key_type=trustme.KeyType.RSA)
        issued = ca.issue_cert(LOOPBACK, key_type=trustme.KeyType.RSA)
        for user in USERS:
            client = ca.issue_cert(f"{user}.clients.test", common_name=user)
            client.private_key_pem.write_to_path(str(directory / f"{user}.key"))
            (directory / f"{user}.pem").write_bytes(
                b"".join(blob.bytes() for blob in client.cert_chain_pems)
            )
        ca.cert_pem.write_to_path(str(directory / "ca.pem"))
        key = serialization.load_pem_private_key(issued.private_key_pem.bytes(), None)
        pkcs8 = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        chain = b"".join(blob.bytes() for blob in issued.cert_chain_pems)
        (directory / "server.pem").write_bytes(pkcs8 + chain)
