"""benchmarks/gpu_vllm_serve.sh on CPU: vLLM and its wheels staged in pieces that fit a device call, received piece by
piece and installed (a stand-in vLLM tree and wheel), and a run without vLLM stopping at once with a clear message."""
import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_vllm_serve.sh"
# every module the script's import check names, as empty stand-ins (the real ones need the H200 image)
STUBS = ("uvicorn", "h11", "click", "uvloop", "httptools", "watchfiles", "prometheus_client",
         "prometheus_fastapi_instrumentator", "model_hosting_container_standards", "fastapi", "starlette", "openai")


def _wheel(folder: Path, name: str) -> None:
    """A minimal pure-Python wheel holding the module `name` (pip installs it offline)."""
    dist = f"{name}-0.1.dist-info"
    with zipfile.ZipFile(folder / f"{name}-0.1-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}.py", "VALUE = 1\n")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", f"{name}.py,,\n{dist}/METADATA,,\n{dist}/WHEEL,,\n{dist}/RECORD,,\n")


def _fake_vllm_dir(folder: Path) -> None:
    """xzpart.00 + xzpart.01 (one tar.xz: a vllm package with the modules the check imports, plus STUBS) and deps/."""
    files = {"vllm/__init__.py": "__version__ = '0.26.0'\n"}
    for pkg in ("vllm/entrypoints", "vllm/entrypoints/openai", "vllm/entrypoints/cli"):
        files[f"{pkg}/__init__.py"] = ""
    for mod in ("vllm/entrypoints/openai/api_server.py", "vllm/entrypoints/cli/main.py",
                "vllm/entrypoints/cli/serve.py"):
        files[mod] = "import deps_stub  # installed from deps/\n"
    for stub in STUBS:
        files[f"{stub}/__init__.py"] = "__version__ = '0'\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    data = buf.getvalue()
    folder.mkdir()
    (folder / "xzpart.00").write_bytes(data[: len(data) // 2])
    (folder / "xzpart.01").write_bytes(data[len(data) // 2:])
    (folder / "deps").mkdir()
    _wheel(folder / "deps", "deps_stub")


@pytest.fixture
def repo(tmp_path):
    """A git checkout holding the script (its --stage sizes this checkout's tree), and .vllmserve/wheels."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "benchmarks" / SCRIPT.name)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".vllmserve" / "wheels").mkdir(parents=True)
    _wheel(root / ".vllmserve" / "wheels", "serve_stub")
    return root


def _sh(repo, *args, **env):
    run_env = {"PATH": "/usr/bin:/bin", "HOME": str(repo), "VLLM_PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(repo / "benchmarks" / SCRIPT.name), *args], cwd=repo, env=run_env,
                          capture_output=True, text=True, timeout=120)


def test_stage_then_receive_each_piece_installs_vllm(tmp_path, repo):
    _fake_vllm_dir(tmp_path / "vllm-h200")
    out = _sh(repo, "--stage", str(tmp_path / "vllm-h200"), PIECE_BYTES="4096")
    assert out.returncode == 0, out.stderr
    pieces = sorted(p.name for p in repo.iterdir() if p.name.startswith(".vllm") and p.name[5:].isdigit())
    assert len(pieces) >= 3, out.stdout
    for k in range(1, len(pieces) + 1):
        assert f'carry [".vllm{k}"]  command: bash benchmarks/gpu_vllm_serve.sh --receive .vllm{k}' in out.stdout
    assert "/.vllm[0-9]*/" in (repo / ".git" / "info" / "exclude").read_text()
    env = {"VSITE": str(tmp_path / "vsite"), "VSTAGE": str(tmp_path / "vstage")}
    for k in range(1, len(pieces)):
        got = _sh(repo, "--receive", f".vllm{k}", **env)
        assert got.returncode == 0 and f"{k} of {len(pieces)} pieces there" in got.stdout, got.stderr
        assert not (tmp_path / "vsite" / "vllm").exists()
    last = _sh(repo, "--receive", f".vllm{len(pieces)}", **env)
    assert last.returncode == 0, last.stdout + last.stderr
    assert "vllm 0.26.0 from" in last.stdout and "vLLM installed in" in last.stdout
    assert (tmp_path / "vsite" / "deps_stub.py").is_file() and (tmp_path / "vsite" / "serve_stub.py").is_file()


def test_a_piece_from_another_stage_is_refused(tmp_path, repo):
    _fake_vllm_dir(tmp_path / "vllm-h200")
    assert _sh(repo, "--stage", str(tmp_path / "vllm-h200"), PIECE_BYTES="8192").returncode == 0
    part = next((repo / ".vllm2").glob("bundle.part.*"))
    part.write_bytes(b"x" + part.read_bytes()[1:])
    env = {"VSITE": str(tmp_path / "vsite"), "VSTAGE": str(tmp_path / "vstage")}
    n = len([p for p in repo.iterdir() if p.name.startswith(".vllm") and p.name[5:].isdigit()])
    results = [_sh(repo, "--receive", f".vllm{k}", **env) for k in range(1, n + 1)]
    assert results[-1].returncode == 1 and "sha256" in results[-1].stderr
    assert not (tmp_path / "vsite" / "vllm").exists()


def test_bad_invocations_are_one_line_errors(tmp_path, repo):
    got = _sh(repo, "--receive", ".nothing")
    assert got.returncode == 2 and "no bundle.manifest there" in got.stderr
    got = _sh(repo, "--stage", str(tmp_path / "absent"))
    assert got.returncode == 2 and "not found" in got.stderr


def test_a_run_without_vllm_stops_at_once(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "VSITE": str(tmp_path / "no-vsite"), "VLLM_PYTHON": sys.executable,
           "SERVERS": "vllm", "OUT": ""}
    got = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert got.returncode == 3, got.stdout + got.stderr
    assert "vLLM's API server does not import from VSITE=" in got.stdout


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
