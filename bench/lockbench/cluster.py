"""The servers a run starts and talks to: the scratch PostgreSQL cluster, run from a
snapshot of BENCH_PG_BIN's PostgreSQL and its lockext (Cluster, psql), the check that the
snapshot's lockext is a release build, the scratch Redis with its RESP client, and the
scratch etcd.

Nothing here measures: the runner drives pgbench, redisbench and etcdbench against these
servers.
"""
import os
import shutil
import socket
import subprocess
import time

from .config import (ETCD_DIR, ETCD_PORT, PG_BIN, PG_HOME, PG_PORT, PSQL, REDIS_DIR, REDIS_PORT,
                     SNAPSHOT, SOURCE_PG_BIN)
from .shell import BenchError, log, run

# Settings of the scratch cluster (ALTER SYSTEM, then a restart). No checkpoint or WAL
# recycling inside a run; everything else is PostgreSQL's default (fsync, fdatasync,
# synchronous_commit = on, full_page_writes, autovacuum).
PG_SETTINGS = {
    "shared_buffers": "512MB",
    "max_wal_size": "16GB",
    "min_wal_size": "1GB",
    "checkpoint_timeout": "1h",
    "track_wal_io_timing": "on",
    "max_connections": "200",
}


class Cluster:
    """The scratch cluster, configured as scripts/cluster.sh configures its own (loopback,
    the postgres OS user, lockext preloaded and its reaper on database postgres), plus
    PG_SETTINGS, but run from a copy of the installed PostgreSQL and lockext taken when
    the benchmark starts.

    Why a copy: `make install` rewrites lockext.so in place, and a server that preloaded
    it then crashes (SIGSEGV/SIGILL in the postmaster); a library replaced between two
    backends would even mix two builds in one run. With the copy, installing while a
    benchmark runs changes nothing.

    What is copied: the bin, $libdir and share directories of the PostgreSQL in
    BENCH_PG_BIN (Debian's, or a relocated tree such as /opt/x/usr/lib/postgresql/15/bin),
    as its own pg_config reports them, each to SNAPSHOT + its path. PostgreSQL finds its
    $libdir and share directory relative to its binary, so the copied server finds the
    copied lockext.so and lockext's control and SQL files, whichever tree it came from;
    `pg_config` in SQL shows those paths, and create() checks them."""

    data = os.path.join(PG_HOME, "data")
    log = os.path.join(PG_HOME, "postgres.log")

    def pg_ctl(self, *args, check=True):
        return run(["runuser", "-u", "postgres", "--", os.path.join(PG_BIN, "pg_ctl"), "-D",
                    self.data, *args], check=check)

    def running(self):
        return os.path.exists(os.path.join(self.data, "PG_VERSION")) and \
            self.pg_ctl("status", check=False).returncode == 0

    def stop(self):
        if self.running():
            self.pg_ctl("-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self):
        if os.path.isdir(PG_HOME):
            try:
                self.stop()
            except BenchError as e:
                log(str(e))
        shutil.rmtree(PG_HOME, ignore_errors=True)

    def create(self, allow_debug):
        """Returns whether lockext is a debug build (refused unless allow_debug)."""
        self.destroy()
        if port_open(PG_PORT):
            raise BenchError(f"port {PG_PORT} is taken by another server (BENCH_PG_PORT chooses another)")
        tree = source_tree()
        os.makedirs(PG_HOME)
        for src in (SOURCE_PG_BIN, tree["PKGLIBDIR"], tree["SHAREDIR"]):
            dst = SNAPSHOT + src
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            run(["cp", "-a", src, dst])
        shutil.chown(PG_HOME, "postgres", "postgres")
        is_debug = check_library(SNAPSHOT + tree["PKGLIBDIR"] + "/lockext.so", allow_debug)
        run(["runuser", "-u", "postgres", "--", os.path.join(PG_BIN, "initdb"), "-D", self.data,
             "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"""
# lockext benchmark cluster: as scripts/cluster.sh, plus the benchmark's settings
listen_addresses = '127.0.0.1'
port = {PG_PORT}
unix_socket_directories = '{PG_HOME}'
shared_preload_libraries = 'lockext'
lockext.database = 'postgres'
lockext.reap_interval = '1s'
log_line_prefix = '%m [%p] %b '
""")
            for k, v in PG_SETTINGS.items():
                f.write(f"{k} = '{v}'\n")
        self.pg_ctl("-l", self.log, "-w", "-t", "60", "start")
        psql("CREATE EXTENSION lockext")
        for name, what in (("PKGLIBDIR", "loads its libraries"), ("SHAREDIR", "reads its extensions")):
            where = psql(f"SELECT setting FROM pg_config WHERE name = '{name}'")
            if where != SNAPSHOT + tree[name]:
                raise BenchError(f"the copied server {what} from {where}, not the copy")
        return is_debug


def source_tree():
    """The directories of the PostgreSQL that BENCH_PG_BIN names, as its pg_config says
    (BINDIR, PKGLIBDIR, SHAREDIR)."""
    pg_config = os.path.join(SOURCE_PG_BIN, "pg_config")
    if not os.path.exists(pg_config):
        raise BenchError(f"{pg_config} is missing: BENCH_PG_BIN must be the bin directory of a "
                         "PostgreSQL 15 with lockext installed")
    lines = run([pg_config, "--bindir", "--pkglibdir", "--sharedir"]).stdout.split("\n")
    tree = dict(zip(("BINDIR", "PKGLIBDIR", "SHAREDIR"), lines))
    if os.path.realpath(tree["BINDIR"]) != SOURCE_PG_BIN:
        raise BenchError(f"{pg_config} reports its bin directory as {tree['BINDIR']}, not "
                         f"{SOURCE_PG_BIN}")
    if not os.path.exists(os.path.join(tree["SHAREDIR"], "extension", "lockext.control")):
        raise BenchError(f"lockext is not installed in {tree['SHAREDIR']}: run make install "
                         "first (or point BENCH_PG_BIN at a PostgreSQL that has it)")
    return tree


def psql(sql, options="", db="postgres"):
    env = dict(os.environ, PGOPTIONS=options) if options else None
    p = run([PSQL, "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres",
             "-d", db, "-v", "ON_ERROR_STOP=1", "-c", sql], env=env)
    return p.stdout.strip()


def psql_file(path):
    run([PSQL, "-X", "-q", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres", "-d", "postgres",
         "-v", "ON_ERROR_STOP=1", "-f", path])


# ---------------------------------------------------------------------------------------
# The installed extension: a benchmark of a debug build means nothing.

def check_library(path, allow_debug):
    if not os.path.exists(path):
        raise BenchError(f"{path} is missing: run make install first")
    sections = run(["readelf", "-S", "--wide", path]).stdout
    if ".debug_info" in sections and not allow_debug:
        raise BenchError(f"{path} is a debug build (it has .debug_info): `make bench` installs "
                         "the release build first; BENCH_ALLOW_DEBUG=1 runs anyway")
    return ".debug_info" in sections


# ---------------------------------------------------------------------------------------
# Redis

class Redis:
    def __init__(self):
        self.proc = None

    def start(self):
        shutil.rmtree(REDIS_DIR, ignore_errors=True)
        os.makedirs(REDIS_DIR)
        conf = os.path.join(REDIS_DIR, "redis.conf")
        with open(conf, "w") as f:
            f.write(f"""bind 127.0.0.1
port {REDIS_PORT}
protected-mode yes
dir {REDIS_DIR}
logfile {REDIS_DIR}/redis.log
daemonize no
save ""
appendonly yes
appendfsync always
auto-aof-rewrite-percentage 0
""")
        if port_open(REDIS_PORT):
            raise BenchError(f"port {REDIS_PORT} is taken (BENCH_REDIS_PORT chooses another)")
        self.proc = subprocess.Popen(["redis-server", conf], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for _ in range(100):
            if port_open(REDIS_PORT):
                break
            time.sleep(0.05)
        else:
            raise BenchError("redis-server did not start: see " + REDIS_DIR + "/redis.log")
        self.version = self.cmd("INFO", "server").split("redis_version:")[1].split()[0]

    def stop(self):
        stop_process(self.proc)

    def pipeline(self, commands):
        """Sends RESP commands in one stream and returns the replies' first lines."""
        out = bytearray()
        for args in commands:
            out += b"*%d\r\n" % len(args)
            for a in args:
                a = str(a).encode()
                out += b"$%d\r\n%s\r\n" % (len(a), a)
        with socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=60) as s:
            s.sendall(out)
            replies, buf = [], b""
            while len(replies) < len(commands):
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise BenchError("redis closed the connection")
                buf += chunk
                while len(replies) < len(commands):
                    i = buf.find(b"\r\n")
                    if i < 0:
                        break
                    line = buf[:i].decode()
                    buf = buf[i + 2:]
                    if line.startswith("$") and line != "$-1":
                        n = int(line[1:])
                        while len(buf) < n + 2:
                            more = s.recv(1 << 16)
                            if not more:
                                raise BenchError("redis closed the connection")
                            buf += more
                        line = buf[:n].decode()
                        buf = buf[n + 2:]
                    replies.append(line)
        return replies

    def cmd(self, *args):
        reply = self.pipeline([args])[0]
        if reply.startswith("-"):
            raise BenchError(f"redis {args[0]}: {reply}")
        return reply

    def fsync_mode(self, mode):
        self.cmd("CONFIG", "SET", "appendfsync", mode)

    def fill(self, commands):
        for i in range(0, len(commands), 10000):
            replies = self.pipeline(commands[i:i + 10000])
            bad = [r for r in replies if r.startswith("-")]
            if bad:
                raise BenchError(f"redis fill: {bad[0]}")


# ---------------------------------------------------------------------------------------
# etcd

class Etcd:
    """One etcd member on loopback, with a fresh data directory, at etcd's defaults: its WAL
    is synced before a write is acknowledged (one sync serves every write of a batch), which
    is the durability of lockext's default grant."""

    def __init__(self):
        self.proc = None
        self.version = None

    def start(self):
        shutil.rmtree(ETCD_DIR, ignore_errors=True)
        os.makedirs(ETCD_DIR)
        for port in (ETCD_PORT, ETCD_PORT + 1):
            if port_open(port):
                raise BenchError(f"port {port} is taken (BENCH_ETCD_PORT chooses another pair)")
        client, peer = f"http://127.0.0.1:{ETCD_PORT}", f"http://127.0.0.1:{ETCD_PORT + 1}"
        self.log = open(os.path.join(ETCD_DIR, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "bench", "--data-dir", os.path.join(ETCD_DIR, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "bench=" + peer],
            stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if self.proc.poll() is not None:
                break
            if port_open(ETCD_PORT):
                break
            time.sleep(0.05)
        if self.proc.poll() is not None or not port_open(ETCD_PORT):
            raise BenchError("etcd did not start: see " + os.path.join(ETCD_DIR, "etcd.log"))
        out = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout
        self.version = out.split()[2] if out.startswith("etcd Version:") else out.strip()

    def stop(self):
        stop_process(self.proc)
        if self.proc:
            self.log.close()


def stop_process(proc):
    """Ends a server the run started (Redis, etcd): SIGTERM, then SIGKILL after 10 s."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
