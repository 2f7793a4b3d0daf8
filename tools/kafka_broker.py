"""Apache Kafka for the local stack: one KRaft node (broker and controller in one JVM) from the
project's pinned release, its jars resolved from Maven Central once.

- **Jars.** ``kafka_classpath`` resolves ``org.apache.kafka:kafka_2.13`` and its runtime tree with
  Maven into a cache outside the checkout (``~/.cache/embedstream/kafka/<version>``, or
  ``EMBEDSTREAM_KAFKA_CACHE``), and reuses it after that. No Java 17+ or no Maven is a
  :class:`~tools.dev.StackError` with one line that says what to install; nothing falls back.
- **Node.** ``prepare_node`` writes ``server.properties`` and a log4j2 file under the state
  directory, and formats the log directory once (``kafka.tools.StorageTool format``); ``node_cmd``
  is the command line that starts it. State and logs stay under ``<state dir>/kafka``.

The broker settings are the local stack's, chosen for tests on two cores: replication factor 1
everywhere (offsets, transactions, share state), a short minimum group session (the fault suite's
2 s sessions), no initial rebalance delay, few partitions for the internal topics, a small heap.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

#: The pinned Apache Kafka release (4.2: share groups are production-ready there, KIP-932).
KAFKA_VERSION = "4.2.0"
#: log4j2's binding for the slf4j 1.x API the broker logs through (without it the broker logs nothing).
LOG4J_VERSION = "2.25.3"
#: Heap for the local node: the start scripts' default of 1 GB is more than two cores' tests need.
HEAP = ["-Xms256m", "-Xmx512m"]

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>embedstream.local</groupId>
  <artifactId>kafka-broker-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


class KafkaSetupError(RuntimeError):
    """Java, Maven or the jars are missing; the message says what to install."""


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    root = os.environ.get("EMBEDSTREAM_KAFKA_CACHE") or Path.home() / ".cache" / "embedstream" / "kafka"
    return Path(root) / version


def java_bin() -> str:
    """``java`` of JAVA_HOME, else of PATH, checked to be 17 or later (Kafka 4's brokers need 17)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if not java:
        raise KafkaSetupError("broker kafka: no `java` found: install Java 17 or later "
                              "(apt-get install openjdk-17-jre-headless), or use --broker tansu")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(found.group(1)) if found else 0
    if major == 1 and found and found.group(2):  # "1.8.0": Java 8
        major = int(found.group(2))
    if major < 17:
        raise KafkaSetupError(f"broker kafka: {java} is Java {major or '?'}; Apache Kafka {KAFKA_VERSION} needs "
                              "Java 17 or later: install it and set JAVA_HOME, or use --broker tansu")
    return java


def kafka_classpath(version: str = KAFKA_VERSION, on_progress=lambda _msg: None) -> str:
    """The broker's classpath (``<cache>/lib/*``), resolving the jars with Maven the first time."""
    cache = cache_dir(version)
    lib, done = cache / "lib", cache / ".complete"
    if done.exists() and lib.is_dir():
        return str(lib / "*")
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaSetupError("broker kafka: no `mvn` found to fetch Apache Kafka's jars from Maven Central: "
                              "install Maven (apt-get install maven), or use --broker tansu")
    on_progress(f"fetching Apache Kafka {version}'s jars with Maven into {cache} (once)")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "pom.xml").write_text(_POM.format(kafka=version, log4j=LOG4J_VERSION))
    staging = cache / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    res = subprocess.run([mvn, "-q", "-B", "-f", str(cache / "pom.xml"), "dependency:copy-dependencies",
                          f"-DoutputDirectory={staging}", "-DincludeScope=runtime"],
                         capture_output=True, text=True, timeout=900)
    if res.returncode != 0 or not any(staging.glob(f"kafka_2.13-{version}.jar")):
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-15:])
        raise KafkaSetupError(f"broker kafka: Maven could not fetch org.apache.kafka:kafka_2.13:{version}:\n{tail}")
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
    done.write_text(version + "\n")
    return str(lib / "*")


def server_properties(data: Path, port: int, controller_port: int) -> str:
    """A single KRaft node on 127.0.0.1 (``port`` for clients, ``controller_port`` for its quorum)."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        # one node: every internal topic with one replica, and few partitions (each is a log to open)
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "6",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "6",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "6",
        # groups: no initial delay; the fault suite's 2 s sessions allowed (the broker's floor is 6 s)
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        # KIP-848 groups: the session and heartbeat are the broker's; short ones for a local stack
        "group.consumer.min.session.timeout.ms": "2000",
        "group.consumer.session.timeout.ms": "6000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "1000",
        # KIP-932 share groups: a record's lock for as short as tests need
        "group.share.min.record.lock.duration.ms": "1000",
        "group.share.min.session.timeout.ms": "2000",
        "group.share.session.timeout.ms": "6000",
        "group.share.min.heartbeat.interval.ms": "500",
        "group.share.heartbeat.interval.ms": "1000",
        # aborted-transaction clean-up sooner than the default 10 s after a transaction times out
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "2000",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def cluster_id() -> str:
    """A new cluster id: 16 random bytes, URL-safe base64 without padding (what StorageTool takes),
    never one that starts with '-': the format command would read it as an option (1 start in 64
    failed so; Kafka's own ids are drawn again for the same reason)."""
    while True:
        cid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def prepare_node(state: Path, port: int, controller_port: int, java: str, classpath: str) -> Path:
    """Write the node's configuration under ``state/kafka`` and format its log directory (a new one
    each start: the local stack keeps no data across ``up``); returns ``server.properties``."""
    home = state / "kafka"
    data = home / "data"
    shutil.rmtree(data, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    props = home / "server.properties"
    props.write_text(server_properties(data, port, controller_port))
    log4j = home / "log4j2.properties"
    log4j.write_text(_LOG4J2.format(log=home / "server.log"))
    res = subprocess.run([java, *HEAP, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath,
                          "kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(props)],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-10:])
        raise KafkaSetupError(f"broker kafka: formatting {data} failed:\n{tail}")
    return props


def node_cmd(state: Path, port: int, controller_port: int) -> list[str]:
    """Resolve the jars, write and format the node, and return the command that starts it."""
    java = java_bin()
    classpath = kafka_classpath()
    props = prepare_node(state, port, controller_port, java, classpath)
    return [java, *HEAP, "-XX:+UseSerialGC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={state / 'kafka' / 'log4j2.properties'}",
            "-cp", classpath, "kafka.Kafka", str(props)]
