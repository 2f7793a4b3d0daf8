"""The image, built from the Dockerfile and run as the chart runs a pod (``make image-check``; ``.ci/run``).

No Docker engine runs on the project's CI host, and no registry serves base images, so this builds with
Debian's podman (``runc``, cgroupfs, no default ulimits: ``CONTAINERS_CONF``) on a base made from
Debian's packages (``mmdebstrap --variant=minbase`` with python3 3.11, imported as
``localhost/embedstream-base:bookworm``, made once and kept). A proxy CA bundle the host trusts
(``PIP_CERT`` or ``SSL_CERT_FILE``) is mounted for the build's downloads, never copied into the image.

1. **The CPU image** (``--build-arg VARIANT=cpu``): its container runs with the default release's
   rendered env (Helm's engine on ``helm/embedstream``, pointed at a local stack on this host's network),
   as the chart's pod: uid 10001, read-only root, ``/tmp`` its only writable mount, all capabilities
   dropped. It must answer ``/readyz``, embed every document produced into Milvus and the output topic,
   and on SIGTERM exit 0 with the group committed at the input's end.
2. **The GPU image** (the default variant): built; it cannot run on a host without a GPU, so its
   container only imports what a GPU worker imports (torch, NVML's bindings, the GPU gauges).

Prints each image's size and build time. Exits non-zero, naming the step, when anything fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "localhost/embedstream-base:bookworm"
IMAGES = {"cpu": "localhost/embedstream:cpu-check", "gpu": "localhost/embedstream:gpu-check"}
DOCS = 60
CONTAINERS_CONF = """[containers]
default_ulimits = []
pids_limit = 0

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


class Failed(RuntimeError):
    pass


def _run(args: list[str], what: str, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if done.returncode != 0:
        raise Failed(f"{what}: exit {done.returncode}\n{(done.stdout + done.stderr)[-4000:]}")
    return done


def podman(*args: str, what: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return _run(["podman", "--runtime", "runc", *args], what, timeout)


def tools_missing() -> list[str]:
    return [t for t in ("podman", "runc", "mmdebstrap") if shutil.which(t) is None]


def base_image(work: Path) -> None:
    """The Debian base (python3 3.11, ca-certificates), made once per host."""
    if subprocess.run(["podman", "image", "exists", BASE_IMAGE]).returncode == 0:
        return
    rootfs = work / "rootfs.tar"
    _run(["mmdebstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates", "bookworm",
          str(rootfs)], "the base's root filesystem (mmdebstrap)", 900)
    podman("import", str(rootfs), BASE_IMAGE, what="the base's import")


def build(variant: str) -> tuple[float, int]:
    """The image of ``variant`` from the Dockerfile; (seconds, bytes)."""
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    mount = ["-v", f"{ca}:/etc/build-ca.pem:ro", "--build-arg", "PIP_CERT=/etc/build-ca.pem"] if ca else []
    t0 = time.monotonic()
    podman("build", "--network", "host", *mount, "--build-arg", f"BASE={BASE_IMAGE}", "--build-arg",
           f"VARIANT={variant}", "-t", IMAGES[variant], "-f", "Dockerfile", str(REPO),
           what=f"the {variant} image's build")
    took = time.monotonic() - t0
    size = json.loads(podman("image", "inspect", IMAGES[variant], what="inspect").stdout)[0]["Size"]
    # (the build's mount point stays behind as an empty file: a certificate in it, or in the app, is a leak)
    leaked = podman("run", "--rm", "--network", "none", "--entrypoint", "sh", IMAGES[variant], "-c",
                    "grep -rl 'BEGIN CERTIFICATE' /etc/build-ca.pem /app 2>/dev/null | head -1; true",
                    what="the build's CA left behind").stdout.strip()
    if leaked:
        raise Failed(f"the {variant} image holds the build's CA bundle: {leaked}")
    return took, size


def rendered_worker(stack_env: dict[str, str], s) -> tuple[dict, list[str], dict[str, str]]:
    """The default release's worker (Helm's engine), for the local stack: its container, args and env."""
    from tests.unit.helm_engine import Engine, objects, pod_command, release_values

    engine = Engine()
    try:
        objs = objects(engine.render(str(REPO / "helm" / "embedstream"), release_values(s), name="es",
                                     namespace="ml"))
    finally:
        engine.close()
    deployment = objs["Deployment"]
    secrets = {("embedstream-redis", "url"): stack_env["EMBEDSTREAM_REDIS_URL"]}
    args, env = pod_command(deployment, secrets, "es-embedstream-5d8c7-image")
    pod = deployment["spec"]["template"]["spec"]
    [c] = pod["containers"]
    return {**c, "podSecurityContext": pod.get("securityContext", {})}, args, env


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return reply.status == 200
    except OSError:
        return False


def run_cpu_container(work: Path) -> dict:
    """Step 1's container on a local stack; returns what it saw."""
    from tests.helpers import documents_in_milvus, fresh_settings, read_topic
    from tools.dev import LocalStack, free_port

    stack = LocalStack(work / "stack", broker="kafka")
    stack.up(partitions=2)
    try:
        s = fresh_settings(stack.env(), partitions=2)
        container, args, env = rendered_worker(stack.env(), s)
        sec = container.get("securityContext", {})
        user = container["podSecurityContext"].get("runAsUser", 10001)
        assert sec.get("readOnlyRootFilesystem") and sec.get("capabilities", {}).get("drop") == ["ALL"], sec
        port = free_port()
        env["EMBEDSTREAM_METRICS_PORT"] = str(port)  # the pod's own port; here the host's network is shared
        ids = _produce(s, DOCS)
        flags = [f"--user={user}", "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges",
                 "--network=host", "--tmpfs=/tmp:rw,size=256m"]
        command = ["run", "--rm", "--name", "embedstream-image-check", *flags,
                *[x for k, v in env.items() for x in ("-e", f"{k}={v}")], IMAGES["cpu"], *args]
        log = (work / "container.log").open("w")
        t0 = time.monotonic()
        proc = subprocess.Popen(["podman", "--runtime", "runc", *command], stdout=log, stderr=subprocess.STDOUT)
        try:
            ready = _until(lambda: _answers(f"http://127.0.0.1:{port}/readyz"), 180, proc, work, "/readyz")
            ready_s = time.monotonic() - t0
            _until(lambda: set(_in_milvus(s, documents_in_milvus)) == ids, 240, proc, work, "the documents in Milvus")
            out = {m.key().decode() for m in read_topic(s, s.output_topic, expect=len(ids))}
            if out != ids:
                raise Failed(f"the output topic holds {len(out)} of the {len(ids)} documents")
            subprocess.run(["podman", "kill", "--signal", "TERM", "embedstream-image-check"], capture_output=True)
            code = proc.wait(90)
        finally:
            if proc.poll() is None:
                subprocess.run(["podman", "kill", "embedstream-image-check"], capture_output=True)
                proc.wait(30)
        text = (work / "container.log").read_text(errors="replace")
        if code != 0:
            raise Failed(f"the container exited {code} on SIGTERM:\n{text[-3000:]}")
        if "its compiled copy loaded" not in text:  # the copy the build baked, read by uid 10001
            raise Failed(f"the container compiled the int8 model at start instead of loading the image's "
                         f"compiled copy:\n{text[-3000:]}")
        lag = _group_lag(s)
        if lag != 0:
            raise Failed(f"the group's lag after the stop is {lag}, not 0:\n{text[-3000:]}")
        return {"ready_s": round(ready_s, 1), "docs": len(ids), "exit": code, "ready": ready,
                "precision": found.group(1) if (found := re.search(r"precision[= ](\w+)", text)) else "?"}
    finally:
        stack.down()


def _produce(s, n: int) -> set[str]:
    from connectors.kafka import make_producer
    from schemas.codec import Document, encode_document

    producer = make_producer(s.kafka_common())
    for i in range(n):
        d = Document(f"img{i}", f"a document the image's container embeds, number {i}")
        producer.produce(s.input_topic, key=d.id, value=encode_document(d))
    if producer.flush(30) != 0:
        raise Failed("the documents could not be produced")
    return {f"img{i}" for i in range(n)}


def _in_milvus(s, read) -> dict:
    try:
        return read(s)
    except Exception:  # no collection until the worker has made it
        return {}


def _group_lag(s) -> int:
    from connectors.kafka import make_admin
    from connectors.lag import GroupOffsets, group_lag

    with GroupOffsets(s.kafka_common(), s.group_id) as offsets:
        return sum(p.lag for p in group_lag(make_admin(s.kafka_common()), offsets, s.input_topic, "earliest"))


def _until(check, seconds: float, proc: subprocess.Popen, work: Path, what: str) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        if proc.poll() is not None:
            raise Failed(f"the container exited {proc.returncode} before {what}:\n"
                         f"{(work / 'container.log').read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    raise Failed(f"not within {seconds:.0f} s: {what}\n{(work / 'container.log').read_text(errors='replace')[-3000:]}")


def gpu_imports() -> str:
    """Step 2: what a GPU worker imports, in the GPU image's container (no GPU here)."""
    code = ("import torch, pynvml; from worker.process import gpu_metrics; from worker.embedding.sentence import "
            "pick_device; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gauges', "
            "len(gpu_metrics.GAUGES))")
    done = podman("run", "--rm", "--network", "none", "--read-only", "--user", "10001", "--entrypoint", "python",
                  IMAGES["gpu"], "-c", code, what="the GPU image's imports", timeout=300)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="cpu,gpu", help="which images to build (default cpu,gpu)")
    ap.add_argument("--keep", action="store_true", help="keep the images built (by default they are removed)")
    args = ap.parse_args(argv)
    missing = tools_missing()
    if missing:
        print(f"image-check needs {', '.join(missing)}: apt-get install -y podman buildah runc mmdebstrap "
              "fuse-overlayfs uidmap (Debian's packages)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="embedstream-image-") as tmp:
        work = Path(tmp)
        (work / "containers.conf").write_text(CONTAINERS_CONF)
        os.environ["CONTAINERS_CONF"] = str(work / "containers.conf")
        try:
            base_image(work)
            for variant in args.variants.split(","):
                took, size = build(variant)
                print(f"{variant} image: built in {took:.0f} s, {size / 1e9:.2f} GB ({IMAGES[variant]})", flush=True)
                if variant == "cpu":
                    seen = run_cpu_container(work)
                    print(f"cpu container, as the chart's pod (uid 10001, read-only root, /tmp its only writable "
                          f"mount): ready in {seen['ready_s']} s at {seen['precision']}, {seen['docs']} documents "
                          "embedded into Milvus and the output topic, exit 0 on SIGTERM, lag 0", flush=True)
                else:
                    print(f"gpu container: {gpu_imports()}", flush=True)
        except (Failed, subprocess.TimeoutExpired, AssertionError) as exc:
            print(f"image-check failed: {exc}", file=sys.stderr)
            return 1
        finally:
            if not args.keep:  # 6 GB an image: none left behind run after run (the base is kept)
                subprocess.run(["podman", "rmi", "--force", *IMAGES.values()], capture_output=True)
                subprocess.run(["podman", "image", "prune", "--force"], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
