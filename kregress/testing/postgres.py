"""A throwaway PostgreSQL server for tests and benchmarks (initdb + pg_ctl on a free port; stdlib only).

PostgreSQL 15 is on every machine of this project's kind (``initdb``, ``pg_ctl``). As root, the server runs as
the ``postgres`` (else ``nobody``) user, since PostgreSQL refuses root. Used by the ledger and shared-instance
tests and by ``bench/scale.py``::

    server = PgServer(pg_bin_dir()); server.start()
    url = server.url("postgres")
    ...
    server.stop()
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_USER, PG_PASSWORD = "kregress", "s3cret-Pw_9"

def pg_bin_dir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres (PATH first, then /usr/lib/postgresql/*/bin, newest first)."""
    dirs = []
    if shutil.which("pg_ctl"):
        dirs.append(Path(shutil.which("pg_ctl")).resolve().parent)
    dirs += sorted((Path(d) for d in glob.glob("/usr/lib/postgresql/*/bin")), key=lambda d: -int(d.parent.name) if d.parent.name.isdigit() else 0)
    for d in dirs:
        if all((d / b).is_file() for b in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One throwaway server: ``start()`` (initdb into a temp folder, pg_ctl on a free port), ``url(db)``, ``stop()``."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="kregress-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self.running = False
        self.run_as: dict = {}
        self.timings: dict[str, float] = {}
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pw = pwd.getpwnam(name)
                except KeyError:
                    continue
                self.run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
                self.user = name
                break
            else:
                raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists (PostgreSQL refuses root)")
            os.chown(self.root, self.run_as["user"], self.run_as["group"])
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self.env.update(LC_ALL="C", HOME=str(self.root))

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bindir / args[0]), *args[1:]], env=self.env, cwd=self.root, capture_output=True,
                              text=True, timeout=timeout, **self.run_as)

    def start(self) -> None:
        t0 = time.monotonic()
        pwfile = self.root / "pw"
        pwfile.write_text(PG_PASSWORD + "\n")
        if self.run_as:
            os.chown(pwfile, self.run_as["user"], self.run_as["group"])
        r = self._run("initdb", "-D", str(self.data), "-U", PG_USER, f"--pwfile={pwfile}", "--auth-local=trust",
                      "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync")
        if r.returncode:
            raise RuntimeError(f"initdb failed as {self.user}: {(r.stderr or r.stdout).strip()[-800:]}")
        self.timings["initdb_s"] = time.monotonic() - t0
        for _ in range(3):  # a free port can be taken between the probe and the bind: try another
            t1 = time.monotonic()
            self.port = free_port()
            opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
                    "-c full_page_writes=off -c max_connections=60 -c shared_buffers=32MB")
            r = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "30", "start")
            if r.returncode == 0:
                self.running = True
                self.timings["start_s"] = time.monotonic() - t1
                return
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        log = self.log.read_text()[-800:] if self.log.exists() else ""
        raise RuntimeError(f"pg_ctl start failed as {self.user}: {(r.stderr or r.stdout).strip()[-400:]} {log}")

    def stop(self) -> None:
        if self.running:
            r = self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=30)
            self.running = r.returncode != 0
            if self.running:  # pg_ctl could not stop it: end the postmaster we started, by its pid
                pid_file = self.data / "postmaster.pid"
                if pid_file.exists():
                    try:
                        os.kill(int(pid_file.read_text().split()[0]), 9)
                        self.running = False
                    except (ProcessLookupError, ValueError):
                        self.running = False
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, db: str, *, password: str | None = PG_PASSWORD, scheme: str = "postgresql") -> str:
        auth = PG_USER + (f":{password}" if password is not None else "")
        return f"{scheme}://{auth}@127.0.0.1:{self.port}/{db}"
