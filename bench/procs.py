"""Process plumbing for the benchmark: the fake upstream, the relay, wrk and
readings from /proc (peak memory, CPU time).  Linux only, as /proc is."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.helpers import free_port, wait_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Child:
    """A child process whose output goes to a log file."""

    def __init__(self, name: str, cmd: list, log_path: str, env: dict | None = None,
                 cwd: str = ROOT):
        self.cwd = cwd
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, port: int, timeout: float = 60.0) -> "Child":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        try:
            wait_port(port, self.proc, timeout=timeout, what=self.name)
        except RuntimeError:
            self.stop()
            sys.stderr.write(self.tail())
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self._log.close()

    def tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""


def start_upstream(workdir: str) -> tuple[Child, str]:
    port = free_port()
    child = Child("fake upstream", [sys.executable, "-m", "tests.fakes.openai_upstream",
                                    "--port", str(port), "--no-record"],
                  os.path.join(workdir, "upstream.log"))
    child.start(port)
    return child, f"http://127.0.0.1:{port}"


def start_bare_proxy(workdir: str, upstream_url: str, uvloop: bool = False) -> tuple[Child, str]:
    port = free_port()
    name = "bare_uvloop" if uvloop else "bare"
    child = Child(name, [sys.executable, os.path.join(ROOT, "bench", "bare_proxy.py"),
                         "--port", str(port), "--upstream", upstream_url]
                  + (["--uvloop"] if uvloop else []),
                  os.path.join(workdir, name + ".log"))
    child.start(port)
    return child, f"http://127.0.0.1:{port}"


def start_relay(workdir: str, admin_password: str, root: str = ROOT,
                name: str = "relay", extra_env: dict | None = None) -> tuple[Child, str]:
    """`python server.py` of the tree at `root` (another checkout for A/B)."""
    port = free_port()
    data_dir = os.path.join(workdir, name + "-data")
    os.makedirs(data_dir, exist_ok=True)
    env = dict(os.environ, RELAY_ADMIN_PASSWORD=admin_password, PYTHONUNBUFFERED="1")
    # An outside RELAY_MONGO_URL would point the bench at someone's database.
    env.pop("RELAY_MONGO_URL", None)
    env.update(extra_env or {})
    child = Child(name, [sys.executable, os.path.join(root, "server.py"), "--host",
                         "127.0.0.1", "--port", str(port), "--data-dir", data_dir],
                  os.path.join(workdir, name + ".log"), env=env, cwd=root)
    child.start(port, timeout=120)
    return child, f"http://127.0.0.1:{port}"


# ---- /proc readings ---------------------------------------------------------
def tear_down(children, work: str, keep: bool = False) -> None:
    """Stop the children started (None: never started) and remove the work
    directory, or say where its logs are."""
    for child in children:
        if child is not None:
            child.stop()
    if keep:
        print(f"logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def status_kb(pid: int, field: str) -> int:
    """A kB figure from /proc/<pid>/status (VmHWM = peak resident set)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name may hold spaces; fields after ")" are fixed.
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def database(pid: int) -> list[int]:
    """The relay's embedded database child (models/embedded.py), not its
    other children (the password-strength helper, models/strength.py)."""
    out = []
    for child in children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"secantus" in cmd or b"nx_27017" in cmd or b"nx_server.py" in cmd:
            out.append(child)
    return out


def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    import platform

    import tornado
    try:
        import pycurl
        curl = pycurl.version
    except ImportError:
        curl = ""
    wrk = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "implementation": platform.python_implementation(), "tornado": tornado.version,
            "pycurl": curl, "wrk": (wrk.stdout or wrk.stderr).split("\n")[0].strip(),
            "kernel": platform.release(), "loadavg_at_start": os.getloadavg()}


# ---- wrk --------------------------------------------------------------------
def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def wrk(url: str, body: str, key: str = "", connections: int = 20, threads: int = 1,
        duration: float = 10.0, watch: dict | None = None, body_file: str = "",
        headers: dict | None = None) -> dict:
    """One wrk run; returns its figures and the share of one core that each
    process in `watch` ({name: pid}) used meanwhile.  `body_file` instead of
    `body` for bodies too large for the environment; `headers` are sent too."""
    watch = watch or {}
    env = dict(os.environ, BENCH_BODY=body, BENCH_KEY=key, BENCH_BODY_FILE=body_file,
               BENCH_HEADERS="\n".join(f"{k}: {v}" for k, v in (headers or {}).items()))
    cmd = ["wrk", f"-t{min(threads, connections)}", f"-c{connections}", f"-d{duration:g}s",
           "--latency", "--timeout", "30s", "-s", os.path.join(ROOT, "bench", "post.lua"), url]
    cpu0 = {n: (p, cpu_seconds(p)) for n, p in watch.items()}
    t0 = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    raw = json.loads(line.split(" ", 1)[1])
    lat = raw["latency_us"]
    errs = raw["errors"]
    secs = raw["duration_us"] / 1e6
    ok = raw["requests"] - errs["status"]
    out = {
        "connections": connections, "duration_s": round(secs, 2),
        "requests": raw["requests"], "ok": ok, "non_2xx": errs["status"],
        "socket_errors": {k: v for k, v in errs.items() if k != "status" and v},
        "rps": round(ok / secs, 1),
        "p50_ms": lat["p50"] / 1000, "p90_ms": lat["p90"] / 1000, "p99_ms": lat["p99"] / 1000,
        "mean_ms": round(lat["mean"] / 1000, 3), "max_ms": lat["max"] / 1000,
    }
    used = {n: cpu_seconds(p) - c for n, (p, c) in cpu0.items()}
    out["cpu_pct"] = {n: round(100 * u / wall, 1) for n, u in used.items()}
    # CPU time per answered call: unlike req/s, it barely moves when other
    # processes share the cores, so it is the figure to compare builds by.
    out["cpu_us_per_request"] = {n: round(1e6 * u / max(ok, 1), 1) for n, u in used.items()}
    return out
