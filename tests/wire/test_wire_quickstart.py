"""docs/guide/quickstart.md runs as written, steps 1 to 4: its secrets and configuration pass
``config check --strict``; on an empty store (the wire tier's replica set, its URI in place of
the page's) the first administrator is made, the service started with the page's command, and
the administrator signs in through the admin API and finds themselves there; the probes and a
scrape answer. The page's configuration is run unchanged: only the ports move (the test's must
be free ones) and the URI is the test's, as the reader's is their own. Its public URL,
``https://auth.example.org``, is the reader's TLS proxy in front of the service: here a
stand-in proxy with a certificate of a CA made for the test, and the name resolved to it in the
operator's shell (``sitecustomize``), where the reader's DNS and CA do it. Step 5 (mongodump,
mongorestore) needs MongoDB's tools and a real server: it is not run."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import re
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from primary import ReplicaSet
from service import end, free_port, spawn, wait_for_http
from terminal import run_in_terminal

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "guide" / "quickstart.md"
ROOT_PASSWORD = "saffron-lighthouse-meridian"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


def environment(**more: str) -> dict[str, str]:
    """The operator's shell: no TOKENSVC_ variable of the caller's, tokensvc on the PATH."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    bin_dir = str(Path(sys.executable).parent)
    return {**environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], **more}


def bash(script: str, cwd: Path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=180,
                            cwd=cwd, env=environ)
    assert result.returncode == 0, result.stderr + result.stdout
    return result


def browser(tmp_path: Path, typed: Path) -> Path:
    """What the operator does in the browser ``tokensvc login`` opens: signs in as root, and
    reads the confirmation code off the page (into ``typed``, which the terminal then types)."""
    stand_in = tmp_path / "browser"
    stand_in.write_text(f"#!{sys.executable}\n"
                        "import sys\n"
                        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                        "import requests\n"
                        "from service import user_agent_authorize\n"
                        f"landed = user_agent_authorize(sys.argv[1], username='root', password={ROOT_PASSWORD!r},\n"
                        f"                              read=open({str(typed)!r}, 'w').write)\n"
                        "requests.get(landed, timeout=10)\n")
    stand_in.chmod(0o755)
    return stand_in


PUBLIC_NAME = "auth.example.org"  # the page's base_url and auth_url: https, port 443


def page_config() -> str:
    text = blocks("toml")[0]
    assert all(urlsplit(url).hostname == PUBLIC_NAME for url in re.findall(r'_url = "([^"]+)"', text)), text
    return text


def certificate(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA of the test's own and a server certificate for ``name`` it signed: (CA, certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tokensvc quickstart test CA")])

    def signed(subject, public_key, *extensions):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(public_key)
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), False))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical)
        return builder.sign(ca_key, hashes.SHA256())

    ca = signed(ca_name, ca_key.public_key(), (x509.BasicConstraints(ca=True, path_length=0), True),
                (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                               key_encipherment=False, data_encipherment=False, key_agreement=False,
                               encipher_only=False, decipher_only=False), True))
    server = signed(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), key.public_key(),
                    (x509.BasicConstraints(ca=False, path_length=None), True),
                    (x509.SubjectAlternativeName([x509.DNSName(name)]), False),
                    (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@contextlib.contextmanager
def tls_proxy(certificate_file: Path, key_file: Path, port: int) -> Iterator[int]:
    """The reader's TLS proxy in front of the service: TLS on a port of its own (yielded), each
    connection relayed as it is to the service's port. It adds no header: the service takes the
    client's address from the peer (the proxy's networks are 10.0.0.0/8 in the page)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate_file, key_file)
    loop = asyncio.new_event_loop()
    started: list[asyncio.Server] = []
    ready = threading.Event()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            inner_reader, inner_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, inner_writer), pipe(inner_reader, writer))

    async def serve() -> None:
        started.append(await asyncio.start_server(relay, "127.0.0.1", 0, ssl=context))
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield started[0].sockets[0].getsockname()[1]
    finally:
        loop.call_soon_threadsafe(started[0].close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def resolved_to(directory: Path, name: str, port: int) -> Path:
    """A directory for PYTHONPATH whose ``sitecustomize`` makes ``name``:443 resolve to the proxy
    on 127.0.0.1:``port`` in every Python process of the operator's shell (``tokensvc``, the
    browser): the reader's DNS, for the test."""
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(
        "import socket\n"
        "_getaddrinfo = socket.getaddrinfo\n"
        "def getaddrinfo(host, port, *args, **kwargs):\n"
        "    named = host.decode() if isinstance(host, bytes) else host\n"
        f"    if isinstance(named, str) and named.lower() == {name!r} and str(port) in ('443', 'https'):\n"
        f"        return _getaddrinfo('127.0.0.1', {port}, *args, **kwargs)\n"
        "    return _getaddrinfo(host, port, *args, **kwargs)\n"
        "socket.getaddrinfo = getaddrinfo\n")
    return directory


def test_an_operators_first_day_runs_as_written(tmp_path):
    secrets, check, first_admin, start, ready, sign_in, scrape = blocks("sh")[:7]
    (tmp_path / "tokensvc.toml").write_text(page_config())
    # Steps 1 and 2 as written: the page's URI, which config check reads without connecting.
    bash(secrets + check, tmp_path, environment())
    primary = ReplicaSet().start()
    port = free_port()
    admin_port = free_port(port)
    base = f"http://127.0.0.1:{port}"
    # What the reader has in their own: the store's URI; the test's free ports for 8080 and 8081.
    moved = {"TOKENSVC_STORAGE_MONGODB_URI": primary.uri(), "TOKENSVC_PORT": str(port),
             "TOKENSVC_ADMIN_PORT": str(admin_port)}
    exports = "".join(f"export {name}='{value}'\n" for name, value in moved.items())
    ca, server_certificate, server_key = certificate(tmp_path, PUBLIC_NAME)
    try:
        # Step 3: the first administrator in the empty store, then the service.
        bash(secrets + exports + first_admin, tmp_path, environment(ROOT_PASSWORD=ROOT_PASSWORD))
        log = tmp_path / "tokensvc.log"
        with open(log, "w") as output:
            process = spawn(["bash", "-euo", "pipefail", "-c", secrets + exports + "exec " + start], cwd=tmp_path,
                            env=environment(), stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_for_http(base + "/readyz", process, log.read_text)
            with tls_proxy(server_certificate, server_key, port) as proxy_port:
                # In the operator's terminal: tokensvc login asks there for the code the page shows.
                typed = tmp_path / "typed"
                done = run_in_terminal(ready + sign_in + scrape, environment(
                    BASE=base, TOKENSVC_ADMIN_URL=f"http://127.0.0.1:{admin_port}",
                    BROWSER=str(browser(tmp_path, typed)), TOKENSVC_CREDENTIALS=str(tmp_path / "credentials.json"),
                    # The reader's DNS and CA, standing in for them: nothing of tokensvc's configuration.
                    PYTHONPATH=str(resolved_to(tmp_path / "dns", PUBLIC_NAME, proxy_port)),
                    SSL_CERT_FILE=str(ca), REQUESTS_CA_BUNDLE=str(ca)), typed, tmp_path, cwd=tmp_path, seconds=180)
            assert done.returncode == 0, done.stderr + done.stdout
        finally:
            end(process)
        lines = done.stdout.splitlines()
        assert lines[0] == '{"status":"ok"}', lines
        assert lines[1].startswith(f"signed in to http://127.0.0.1:{admin_port} as root"), lines
        assert any(re.fullmatch(r"root\s+u_[0-9a-f]+\s+yes", line.strip()) for line in lines), lines
        assert int(lines[-1]) > 10  # the scrape's tokensvc_ series
        assert f"https://{PUBLIC_NAME}/oauth/authorize?" in done.stderr  # where the page sent the browser
        assert "Traceback" not in log.read_text()
    finally:
        primary.stop()
