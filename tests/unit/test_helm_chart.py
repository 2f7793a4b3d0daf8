"""The Helm chart, rendered by Helm's own engine for several value sets and checked against the
Kubernetes schemas; KEDA's ScaledObject (a CRD) field by field; bad values rejected."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers import missing_tool
from tests.unit.helm_engine import Engine, HelmError, available, container_env, objects

if not available():
    missing_tool("the chart tests need Helm's engine, helm_python (the dev extra's helm-python-sdk): "
                 "`make setup` installs it", module=True)

try:
    import kubernetes_validate
except ImportError:
    missing_tool("the chart tests need kubernetes-validate (the dev extra): `make setup` installs it", module=True)

CHART = Path(__file__).resolve().parents[2] / "helm" / "embedstream"
#: Rendered as `helm template` renders, without a cluster: Helm's engine here knows no CRDs, so the
#: chart's check that KEDA's are there is off (tested on its own below).
BASE = {"kafka": {"bootstrapServers": "kafka.kafka:9092"}, "milvus": {"uri": "http://milvus.milvus:19530"},
        "keda": {"checkCRDs": False}}
CORE_KINDS = {"Deployment", "Service", "ServiceAccount", "PodDisruptionBudget", "HorizontalPodAutoscaler",
              "ConfigMap"}


def merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


_engine: Engine | None = None


@pytest.fixture(scope="module", autouse=True)
def helm():
    """Helm's engine, in a child process for this module (``helm_engine`` says why)."""
    global _engine
    _engine = Engine()
    yield _engine
    _engine.close()
    _engine = None


def render(values: dict) -> dict[str, dict]:
    assert _engine is not None
    return objects(_engine.render(str(CHART), values, name="es", namespace="ml"))


def env_of(objs) -> dict:
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container["env"]}


VALUE_SETS = {
    "defaults (KEDA, scale to zero, CPU)": {},
    "KEDA off → HPA": {"keda": {"enabled": False}},
    "SASL + TLS": {"kafka": {"sasl": {"enabled": True, "existingSecret": "kafka-creds"},
                             "tls": {"enabled": True, "existingSecret": "kafka-ca"}},
                   "milvus": {"tokenSecret": {"name": "milvus-token"}},
                   "redis": {"enabled": True, "existingSecret": "redis-url"}},
    "OAUTHBEARER (OIDC) and mutual TLS": {
        "kafka": {"sasl": {"enabled": True, "mechanism": "OAUTHBEARER", "existingSecret": "kafka-oidc",
                           "oauthbearer": {"tokenEndpointUrl": "https://idp.example.com/token", "scope": "kafka"}},
                  "tls": {"enabled": True, "existingSecret": "kafka-mtls", "clientCert": True}}},
    "GPU": {"gpu": {"enabled": True}, "keda": {"partitions": 24}, "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    "schema registry, basic auth over TLS": {
        "schemaRegistry": {"url": "https://sr.kafka:8081", "existingSecret": "sr-creds", "basicAuthKey": "userinfo",
                           "tls": {"existingSecret": "sr-ca"}, "extraProperties": {"timeout": 10}},
        "records": {"outputFormat": "avro-registry", "keyField": "id"}},
    "migration Job, named alias": {"milvus": {"alias": "docs"},
                                   "migration": {"model": "/models/e5-small", "args": ["--min-overlap", "0.6"]},
                                   "kafka": {"tls": {"enabled": True, "existingSecret": "kafka-ca"}}},
    "fixed replicas": {"keda": {"enabled": False}, "hpa": {"enabled": False}, "replicaCount": 3,
                       "metrics": {"serviceMonitor": {"enabled": True}}},
    "escape hatches, a cache PVC, alerts": {
        "extraEnv": [{"name": "EMBEDSTREAM_LOG_LEVEL", "value": "DEBUG"}],
        "extraEnvFrom": [{"secretRef": {"name": "more-env"}}],
        "extraVolumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "e5-large"}}],
        "extraVolumeMounts": [{"name": "model", "mountPath": "/models", "readOnly": True}],
        "extraInitContainers": [{"name": "fetch-model", "image": "curlimages/curl:8.10.1",
                                 "args": ["-fsSLo", "/models/README.md", "https://models.example/e5/README.md"],
                                 "volumeMounts": [{"name": "model", "mountPath": "/models"}]}],
        "cache": {"enabled": True, "existingClaim": "embedstream-cache"}, "prometheusRule": {"enabled": True}},
}


@pytest.mark.parametrize("extra", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_renders_valid_kubernetes_objects(extra):
    objs = render(merge(BASE, extra))
    for kind, obj in objs.items():
        if kind in CORE_KINDS:
            kubernetes_validate.validate(obj, "1.30", strict=True)
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = env_of(objs)
    assert int(pod["terminationGracePeriodSeconds"]) > int(env["EMBEDSTREAM_SHUTDOWN_GRACE_SECONDS"]["value"])
    assert "EMBEDSTREAM_GROUP_INSTANCE_ID" not in env  # static membership is opt-in (values.yaml says why)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    env = env_of(render(merge(BASE, {"kafka": {"staticMembership": True}})))
    assert env["EMBEDSTREAM_GROUP_INSTANCE_ID"]["value"] == "$(POD_NAME)"
    # the worker refuses a variable that names no setting: the chart sets only ones it knows
    from worker.settings import Settings, unknown_variables

    assert unknown_variables(Settings.model_fields, {name: "x" for name in env_of(objs)}) == []


def test_scaledobject_fields():
    so = render(BASE)["ScaledObject"]
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["spec"]["minReplicaCount"] == 0 and so["spec"]["maxReplicaCount"] <= 6
    [trigger] = so["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    md = trigger["metadata"]
    assert md["bootstrapServers"] == "kafka.kafka:9092" and md["consumerGroup"] == "embedstream"
    assert md["topic"] == "documents"
    for key in ("lagThreshold", "activationLagThreshold", "limitToPartitionsWithLag"):
        assert isinstance(md[key], str), key  # KEDA wants strings
    assert md["offsetResetPolicy"] == "earliest" and md["limitToPartitionsWithLag"] == "true"
    assert "authenticationRef" not in trigger
    assert "HorizontalPodAutoscaler" not in render(BASE)


def test_sasl_wires_secrets_into_worker_and_keda():
    objs = render(merge(BASE, VALUE_SETS["SASL + TLS"]))
    env = env_of(objs)
    assert env["EMBEDSTREAM_KAFKA__SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "kafka-creds"
    assert env["EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert env["EMBEDSTREAM_KAFKA__SSL_CA_LOCATION"]["value"].startswith("/etc/embedstream/kafka-tls/")
    assert env["EMBEDSTREAM_MILVUS_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "milvus-token"
    assert env["EMBEDSTREAM_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "redis-url"
    ta = objs["TriggerAuthentication"]
    params = {r["parameter"]: r for r in ta["spec"]["secretTargetRef"]}
    assert set(params) == {"username", "password", "ca"} and params["password"]["name"] == "kafka-creds"
    trigger = objs["ScaledObject"]["spec"]["triggers"][0]
    assert trigger["authenticationRef"]["name"] == ta["metadata"]["name"]
    assert trigger["metadata"]["sasl"] == "scram_sha512" and trigger["metadata"]["tls"] == "enable"


def test_gpu_request_and_keda_off_hpa():
    objs = render(merge(BASE, VALUE_SETS["GPU"]))
    c = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert env_of(objs)["EMBEDSTREAM_DEVICE"]["value"] == "cuda"
    # A GPU release batches larger (gpu.maxBatch*), unless those are null; a CPU release keeps batching.*
    assert env_of(objs)["EMBEDSTREAM_MAX_BATCH_SIZE"]["value"] == "1024"
    assert env_of(objs)["EMBEDSTREAM_MAX_BATCH_TOKENS"]["value"] == "131072"
    kept = env_of(render(merge(BASE, {"gpu": {"enabled": True, "maxBatchSize": None, "maxBatchTokens": None},
                                      "keda": {"maxReplicaCount": 1}})))
    assert (kept["EMBEDSTREAM_MAX_BATCH_SIZE"]["value"], kept["EMBEDSTREAM_MAX_BATCH_TOKENS"]["value"]) == \
        ("256", "32768")
    assert env_of(render(BASE))["EMBEDSTREAM_MAX_BATCH_SIZE"]["value"] == "256"
    hpa = render(merge(BASE, VALUE_SETS["KEDA off → HPA"]))
    assert "ScaledObject" not in hpa and hpa["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] == 6


def test_a_gpu_releases_migration_job_runs_on_a_gpu_where_the_workers_run():
    placement = {"gpu": {"enabled": True, "count": 2}, "runtimeClassName": "nvidia", "priorityClassName": "gpu-high",
                 "nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                     {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}},
                 "migration": {"model": "/models/e5-small"}, "keda": {"maxReplicaCount": 1, "partitions": 8}}
    objs = render(merge(BASE, placement))
    worker, job = (objs[k]["spec"]["template"]["spec"] for k in ("Deployment", "Job"))
    for key in ("runtimeClassName", "priorityClassName", "nodeSelector", "tolerations", "affinity"):
        assert job[key] == worker[key] == (placement[key] if key != "runtimeClassName" else "nvidia"), key
    limits = job["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1" and limits["memory"] == "6Gi"  # one GPU: one process migrates
    env = {e["name"]: e.get("value") for e in job["containers"][0]["env"]}
    assert env["EMBEDSTREAM_DEVICE"] == "cuda"
    own = render(merge(BASE, merge(placement, {"migration": {"resources": {"limits": {"memory": "12Gi"}}}})))
    job = own["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert job["resources"]["limits"] == {"memory": "12Gi", "nvidia.com/gpu": "1"}  # its own, still its GPU
    cpu = render(merge(BASE, {"migration": {"model": "/models/e5-small"}}))["Job"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"]["limits"] and "runtimeClassName" not in cpu


def test_a_gpu_release_rolls_without_a_surge_pod_and_the_strategy_can_be_set():
    gpu = render(merge(BASE, VALUE_SETS["GPU"]))["Deployment"]["spec"]
    assert gpu["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert "strategy" not in render(BASE)["Deployment"]["spec"]  # Kubernetes' own default on CPUs
    recreate = render(merge(merge(BASE, VALUE_SETS["GPU"]), {"strategy": {"type": "Recreate"}}))
    assert recreate["Deployment"]["spec"]["strategy"] == {"type": "Recreate"}


def test_a_gpu_pods_requests_grow_with_its_processes_unless_given():
    def resources(values: dict) -> dict:
        return render(merge(BASE, values))["Deployment"]["spec"]["template"]["spec"]["containers"][0]["resources"]

    two = {"gpu": {"enabled": True, "count": 2, "workersPerGpu": 4}, "keda": {"partitions": 24, "maxReplicaCount": 3}}
    assert resources(two) == {"requests": {"cpu": "8", "memory": "20480Mi"},
                              "limits": {"memory": "32768Mi", "nvidia.com/gpu": "2"}}  # 8 processes x perProcess
    one = resources({"gpu": {"enabled": True, "workersPerGpu": 1, "perProcess": {"cpu": 0.5}}})
    assert one == {"requests": {"cpu": "0.5", "memory": "2560Mi"},
                   "limits": {"memory": "4096Mi", "nvidia.com/gpu": "1"}}
    given = {"requests": {"cpu": "3", "memory": "9Gi"}, "limits": {"memory": "12Gi"}}
    assert resources(merge(two, {"gpu": {"resources": given}})) == merge(given, {"limits": {"nvidia.com/gpu": "2"}})
    assert resources({}) == yaml.safe_load((CHART / "values.yaml").read_text())["resources"]  # a CPU release


def test_a_gpu_pod_runs_workers_per_gpu_processes_each_with_its_metrics_port():
    objs = render(merge(merge(BASE, VALUE_SETS["GPU"]), {"gpu": {"workersPerGpu": 3},
                                                        "metrics": {"serviceMonitor": {"enabled": True}}}))
    assert env_of(objs)["EMBEDSTREAM_PROCESSES"]["value"] == "3"
    c = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    base = ports["metrics"]
    assert ports == {"metrics": base, "metrics-1": base + 1, "metrics-2": base + 2}
    assert [p["name"] for p in objs["Service"]["spec"]["ports"]] == ["metrics", "metrics-1", "metrics-2"]
    assert [e["port"] for e in objs["ServiceMonitor"]["spec"]["endpoints"]] == ["metrics", "metrics-1", "metrics-2"]
    cpu = render(merge(BASE, {"gpu": {"workersPerGpu": 3}}))  # used only with a GPU
    assert env_of(cpu)["EMBEDSTREAM_PROCESSES"]["value"] == "1"
    assert [p["name"] for p in cpu["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"]] == ["metrics"]


def test_chunking_settings_reach_the_worker():
    env = env_of(render(BASE))
    assert env["EMBEDSTREAM_CHUNKING"]["value"] == "tokens" and "EMBEDSTREAM_CHUNK_TOKENS" not in env
    assert env["EMBEDSTREAM_CHUNK_OVERLAP"]["value"] == "32" and env["EMBEDSTREAM_MAX_CHUNKS"]["value"] == "512"
    env = env_of(render(merge(BASE, {"chunking": {"mode": "off", "tokens": 128}})))
    assert env["EMBEDSTREAM_CHUNKING"]["value"] == "off" and env["EMBEDSTREAM_CHUNK_TOKENS"]["value"] == "128"


def test_delivery_reaches_the_worker():
    env = env_of(render(BASE))
    assert env["EMBEDSTREAM_DELIVERY"]["value"] == "at-least-once"
    env = env_of(render(merge(BASE, {"kafka": {"delivery": "exactly-once"}})))
    assert env["EMBEDSTREAM_DELIVERY"]["value"] == "exactly-once"
    # No instance id: the transactional id is <pod name>-<pid>, and the image's `embedstream run` is pid 1.
    assert "EMBEDSTREAM_GROUP_INSTANCE_ID" not in env
    env = env_of(render(merge(BASE, {"kafka": {"delivery": "exactly-once", "staticMembership": True}})))
    assert env["EMBEDSTREAM_GROUP_INSTANCE_ID"]["value"] == "$(POD_NAME)"  # → transactional.id


def test_group_protocol_reaches_the_worker_and_a_typo_is_refused():
    assert env_of(render(BASE))["EMBEDSTREAM_GROUP_PROTOCOL"]["value"] == "classic"
    env = env_of(render(merge(BASE, {"kafka": {"groupProtocol": "consumer"}})))
    assert env["EMBEDSTREAM_GROUP_PROTOCOL"]["value"] == "consumer"
    with pytest.raises(Exception, match="groupProtocol"):
        render(merge(BASE, {"kafka": {"groupProtocol": "cooperative"}}))


def test_a_share_group_reaches_the_worker_is_not_capped_by_partitions_and_refuses_exactly_once():
    env = env_of(render(BASE))
    assert env["EMBEDSTREAM_GROUP_TYPE"]["value"] == "consumer" and "EMBEDSTREAM_SHARE_MAX_DELIVERIES" not in env
    wide = {"kafka": {"groupType": "share", "shareMaxDeliveries": 3}, "keda": {"partitions": 2, "maxReplicaCount": 8}}
    env = env_of(render(merge(BASE, wide)))  # 8 replicas on 2 partitions: a share group reads each one wider
    assert env["EMBEDSTREAM_GROUP_TYPE"]["value"] == "share" and env["EMBEDSTREAM_SHARE_MAX_DELIVERIES"]["value"] == "3"
    assert "EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS" not in env  # the broker keeps a share group's session
    with pytest.raises(HelmError, match="partitions"):
        render(merge(BASE, {"keda": {"partitions": 2, "maxReplicaCount": 8}}))  # a consumer group: capped
    with pytest.raises(HelmError, match="share groups have no transactions"):
        render(merge(BASE, {"kafka": {"groupType": "share", "delivery": "exactly-once"}}))
    with pytest.raises(Exception, match="groupType"):
        render(merge(BASE, {"kafka": {"groupType": "queue"}}))


SHARE = {"kafka": {"groupType": "share", "groupId": "emb", "inputTopic": "docs"},
         "keda": {"partitions": 2, "maxReplicaCount": 16, "lagThreshold": 500, "activationLagThreshold": 5}}


def test_a_share_group_scales_on_the_backlog_the_exporter_serves():
    """Share mode: KEDA's metrics-api trigger reads /backlog of a Deployment running `embedstream lag
    --serve` (its Service beside it), with the chart's target and activation; its labels are apart
    from the workers' (no worker Service or PDB picks it); no Kafka trigger, no TriggerAuthentication."""
    objs = render(merge(BASE, merge(SHARE, {"kafka": {"tls": {"enabled": True, "existingSecret": "kafka-ca"}}})))
    so = objs["ScaledObject"]
    [trigger] = so["spec"]["triggers"]
    assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {"url": "http://es-embedstream-backlog.ml.svc:9400/backlog",
                                   "valueLocation": "backlog", "targetValue": "500", "activationTargetValue": "5"}
    assert so["spec"]["minReplicaCount"] == 0 and so["spec"]["maxReplicaCount"] == 16  # not capped at 2 partitions
    assert "TriggerAuthentication" not in objs
    exporter, service = objs["Deployment/backlog"], objs["Service/backlog"]
    for obj in (exporter, service):
        kubernetes_validate.validate(obj, "1.30", strict=True)
    pod = exporter["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["args"] == ["lag", "--serve", "9400", "--interval", "10"]
    env = {e["name"]: e for e in c["env"]}
    assert env["EMBEDSTREAM_GROUP_TYPE"]["value"] == "share" and env["EMBEDSTREAM_GROUP_ID"]["value"] == "emb"
    assert env["EMBEDSTREAM_KAFKA__SSL_CA_LOCATION"]["value"].startswith("/etc/embedstream/kafka-tls/")
    assert [v["secret"]["secretName"] for v in pod["volumes"]] == ["kafka-ca"]
    labels = exporter["spec"]["template"]["metadata"]["labels"]
    pdb = objs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]
    for selector in (objs["Service"]["spec"]["selector"], pdb, objs["Deployment"]["spec"]["selector"]["matchLabels"]):
        assert not selector.items() <= labels.items(), selector
    assert service["spec"]["selector"].items() <= labels.items()
    prom = render(merge(BASE, merge(SHARE, {"keda": {"share": {"trigger": "prometheus", "prometheus": {
        "serverAddress": "http://prometheus.monitoring:9090"}}}})))
    [trigger] = prom["ScaledObject"]["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "500"
    assert trigger["metadata"]["query"] == 'sum(embedstream_share_topic_backlog{group="emb",topic="docs"})'
    with pytest.raises(HelmError, match="serverAddress"):
        render(merge(BASE, merge(SHARE, {"keda": {"share": {"trigger": "prometheus"}}})))
    with pytest.raises(HelmError, match="OAUTHBEARER"):
        render(merge(BASE, merge(SHARE, VALUE_SETS["OAUTHBEARER (OIDC) and mutual TLS"])))
    # consumer mode: KEDA's Kafka scaler reads the lag; the exporter is there for the alerts, and optional
    assert "Deployment/backlog" not in render(merge(BASE, {"lagExporter": {"enabled": False}}))


def test_schema_registry_settings_and_secrets_reach_the_worker():
    objs = render(merge(BASE, VALUE_SETS["schema registry, basic auth over TLS"]))
    env = env_of(objs)
    assert env["EMBEDSTREAM_SCHEMA_REGISTRY_URL"]["value"] == "https://sr.kafka:8081"
    ref = env["EMBEDSTREAM_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "sr-creds", "key": "userinfo"}
    assert env["EMBEDSTREAM_SCHEMA_REGISTRY__SSL_CA_LOCATION"]["value"] == "/etc/embedstream/registry-tls/ca.crt"
    assert env["EMBEDSTREAM_SCHEMA_REGISTRY__TIMEOUT"]["value"] == "10"
    assert env["EMBEDSTREAM_OUTPUT_FORMAT"]["value"] == "avro-registry"
    assert env["EMBEDSTREAM_KEY_FIELD"]["value"] == "id"
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert {"name": "registry-tls", "secret": {"secretName": "sr-ca"}} in pod["volumes"]
    # the settings these names become are the worker's own
    from worker.settings import passthrough

    props = passthrough("EMBEDSTREAM_SCHEMA_REGISTRY__", {k: "x" for k in env})
    assert "basic.auth.user.info" in props and "ssl.ca.location" in props
    defaults = env_of(render(BASE))
    assert "EMBEDSTREAM_SCHEMA_REGISTRY_URL" not in defaults
    assert defaults["EMBEDSTREAM_OUTPUT_FORMAT"]["value"] == "avro"


def test_prompts_and_truncation_reach_the_worker():
    env = env_of(render(BASE))
    assert not {"EMBEDSTREAM_DOCUMENT_PROMPT", "EMBEDSTREAM_QUERY_PROMPT", "EMBEDSTREAM_TRUNCATE_DIM"} & set(env)
    env = env_of(render(merge(BASE, {"model": {"documentPrompt": "", "queryPrompt": "query: ", "truncateDim": 256}})))
    assert env["EMBEDSTREAM_DOCUMENT_PROMPT"]["value"] == ""  # "" = no prompt, unlike null (the model's)
    assert env["EMBEDSTREAM_QUERY_PROMPT"]["value"] == "query: " and env["EMBEDSTREAM_TRUNCATE_DIM"]["value"] == "256"


def test_the_sparse_setting_reaches_the_worker_and_the_migration_job():
    env = env_of(render(BASE))
    assert env["EMBEDSTREAM_SPARSE"]["value"] == "off"
    rendered = render(merge(BASE, {"model": {"sparse": "bm25"}, "migration": {"model": "/models/e5"}}))
    assert env_of(rendered)["EMBEDSTREAM_SPARSE"]["value"] == "bm25"
    job = rendered["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e for e in job["env"]}["EMBEDSTREAM_SPARSE"]["value"] == "bm25"  # the backfill fills it


def test_a_model_set_is_a_configmap_the_worker_reads():
    import yaml

    from worker.embedding.models import parse_models

    values = merge(BASE, {"dashboard": {"enabled": False}, "gpu": {"enabled": True}, "keda": {"partitions": 24},
                          "models": {
        "set": {"small": {"path": "/models/minilm", "device": "cpu", "default": True},
                "e5": {"path": "/models/e5", "precision": "fp16", "document_prompt": "passage: "}},
        "memoryMb": 2048}})
    objs = render(values)
    env = env_of(objs)
    assert env["EMBEDSTREAM_MODELS"]["value"] == "/etc/embedstream/models/models.yaml"
    assert env["EMBEDSTREAM_MODEL_MEMORY_MB"]["value"] == "2048" and env["EMBEDSTREAM_DEVICE"]["value"] == "cuda"
    text = objs["ConfigMap"]["data"]["models.yaml"]
    specs = parse_models(yaml.safe_dump(yaml.safe_load(text), default_flow_style=True))
    assert specs["small"].device == "cpu" and specs["e5"].document_prompt == "passage: " and specs["small"].default
    pod = objs["Deployment"]["spec"]["template"]
    assert {"name": "models", "configMap": {"name": objs["ConfigMap"]["metadata"]["name"]}} in pod["spec"]["volumes"]
    assert "checksum/models" in pod["metadata"]["annotations"]  # a changed set rolls the pods
    assert "EMBEDSTREAM_MODELS" not in env_of(render(BASE))


def test_dashboard_is_valid_json_with_the_contract_metrics():
    import json

    from tools.metrics_docs import declared, exporter_declared

    data = render(BASE)["ConfigMap"]["data"]["embedstream.json"]
    dashboard = json.loads(data)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    text = " ".join(exprs)
    for metric in ("embedstream_messages_total", "embedstream_end_to_end_seconds_bucket", "embedstream_consumer_lag",
                   "embedstream_cache_requests_total", "embedstream_dlq_messages_total",
                   "embedstream_gpu_utilization_ratio", "embedstream_gpu_memory_used_bytes",
                   "embedstream_retries_total",
                   "embedstream_fenced_records_total", "embedstream_model_loads_total",
                   "embedstream_model_load_seconds_bucket", "embedstream_rebalances_total"):
        assert metric in text, metric
    # every series named is one the worker (or, for the backlog, the share group's exporter) serves, and
    # every query is scoped to the chosen release(s): the exporter's by its job, "<release>-backlog"
    ours = {name for name, *_ in declared()}
    exporter = {name for name, *_ in exporter_declared()}
    for e in exprs:
        used = {re.sub(r"_(count|bucket|sum)$", "", m) for m in re.findall(r"embedstream_[a-z_]+", e)}
        if used & exporter:
            assert used <= exporter and 'namespace=~"$namespace", job=~"$job-backlog"' in e, e
        else:
            assert used <= ours and 'namespace=~"$namespace", job=~"$job"' in e, (e, used - ours)
    for metric in ("embedstream_share_topic_backlog", "embedstream_share_acknowledgements_total",
                   "embedstream_share_redeliveries_total", "embedstream_share_lock_expiries_total",
                   "embedstream_share_ack_seconds_bucket"):
        assert metric in text, metric
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "job"} <= variables
    # pods are counted as pods, not as processes x models
    assert not any("count(embedstream_model_info" in e for e in exprs)


BAD = {
    "no bootstrap servers": {"kafka": {"bootstrapServers": ""}},
    "bad bootstrap format": {"kafka": {"bootstrapServers": "kafka"}},
    "unknown precision": {"model": {"precision": "fp8"}},
    "SASL without a secret": {"kafka": {"sasl": {"enabled": True}}},
    "negative min replicas": {"keda": {"minReplicaCount": -1}},
    "lag threshold as text": {"keda": {"lagThreshold": "lots"}},
    "bad offset reset policy": {"keda": {"offsetResetPolicy": "newest"}},
    "unknown output format": {"records": {"outputFormat": "protobuf"}},
    "unknown delivery": {"kafka": {"delivery": "at-most-once"}},
    "registry url without a scheme": {"schemaRegistry": {"url": "sr:8081"}},
    "unknown model setting": {"models": {"set": {"m": {"colour": "red"}}}},
    "extraEnv not a list": {"extraEnv": {"EMBEDSTREAM_LOG_LEVEL": "DEBUG"}},
    "a typo in the alerts": {"prometheusRule": {"enabeld": True}},
    "a typo in the cache": {"cache": {"claim": "x"}},
}


@pytest.mark.parametrize("extra", list(BAD.values()), ids=list(BAD))
def test_schema_rejects_bad_values(extra):
    with pytest.raises(HelmError):
        render(merge(BASE, extra))


@pytest.mark.parametrize("extra", [
    {"keda": {"maxReplicaCount": 12}},  # more replicas than partitions
    {"terminationGracePeriodSeconds": 30, "shutdownGraceSeconds": 60},
    {"redis": {"enabled": True}},
    {"records": {"outputFormat": "avro-registry"}},
    {"schemaRegistry": {"url": "http://sr:8081", "basicAuthKey": "userinfo"}},
], ids=["replicas over partitions", "grace shorter than drain", "redis without url", "avro-registry without a registry",
        "credentials without a secret"])
def test_template_rejects_inconsistent_values(extra):
    with pytest.raises(HelmError):
        render(merge(BASE, extra))


def test_helm_lint_is_clean(helm):
    result = helm.lint(str(CHART), BASE, strict=True)
    messages = [m for m in (result.get("messages") or []) if str(m.get("severity", "")).upper() not in ("INFO", "1")]
    assert not messages and not result["errors"], (messages, result["errors"])


def test_a_migration_is_a_job_running_migrate_with_the_workers_settings():
    objs = render(merge(BASE, VALUE_SETS["migration Job, named alias"]))
    job = objs["Job"]["spec"]["template"]["spec"]
    container = job["containers"][0]
    assert container["args"] == ["migrate", "--model", "/models/e5-small", "--min-overlap", "0.6"]
    assert job["restartPolicy"] == "OnFailure"  # a restarted pod resumes the backfill
    env = {e["name"]: e for e in container["env"]}
    assert env == env_of(objs)  # the same settings as the live workers
    assert env["EMBEDSTREAM_MILVUS_ALIAS"]["value"] == "docs"
    assert {m["name"] for m in container["volumeMounts"]} == {"tmp", "kafka-tls"}
    assert "Job" not in render(BASE) and "EMBEDSTREAM_MILVUS_ALIAS" not in env_of(render(BASE))


def test_a_migration_as_a_lane_runs_the_backfill_in_the_workers_and_the_job_only_switches():
    lane = {"migration": {"model": "/models/e5-small", "mode": "lane", "share": 0.5, "args": ["--min-overlap", "0.6"]}}
    objs = render(merge(BASE, lane))
    env = env_of(objs)
    assert (env["EMBEDSTREAM_BACKFILL_MODEL"]["value"], env["EMBEDSTREAM_BACKFILL_SHARE"]["value"]) == (
        "/models/e5-small", "0.5")
    job = objs["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert job["args"] == ["migrate", "--model", "/models/e5-small", "--lane", "--min-overlap", "0.6"]
    assert not {"EMBEDSTREAM_BACKFILL_MODEL", "EMBEDSTREAM_BACKFILL_SHARE"} & {e["name"] for e in job["env"]}
    as_job = render(merge(BASE, {"migration": {"model": "/models/e5-small", "args": ["--min-overlap", "0.6"]}}))
    assert "EMBEDSTREAM_BACKFILL_MODEL" not in env_of(as_job)  # job mode, the default: the workers stay one lane
    assert as_job["Job"]["metadata"]["name"] != objs["Job"]["metadata"]["name"]  # another run, another Job
    assert "EMBEDSTREAM_BACKFILL_MODEL" not in env_of(render(merge(BASE, {"migration": {"mode": "lane"}})))
    with pytest.raises(Exception, match="mode"):
        render(merge(BASE, {"migration": {"model": "/models/e5-small", "mode": "sidecar"}}))
    # the backfill publishes nowhere but its collection unless a topic of its own is named: on the
    # workers in lane mode, on the Job in job mode
    assert not any("EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC" in env_of(o) for o in (objs, as_job))
    for mode in ("lane", "job"):
        named = render(merge(BASE, {"migration": {"model": "/m", "mode": mode, "outputTopic": "embeddings.next"}}))
        job_env = {e["name"]: e["value"] for e in named["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]
                   if "value" in e}
        where = env_of(named) if mode == "lane" else {k: {"value": v} for k, v in job_env.items()}
        assert where["EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC"]["value"] == "embeddings.next", mode


def test_extra_env_volumes_and_the_cache_volume_reach_the_worker_and_the_migration_job():
    values = merge(BASE, VALUE_SETS["escape hatches, a cache PVC, alerts"])
    values["migration"] = {"model": "/models/e5-large"}
    objs = render(values)
    for kind in ("Deployment", "Job"):
        pod = objs[kind]["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert {"name": "EMBEDSTREAM_LOG_LEVEL", "value": "DEBUG"} in c["env"], kind
        assert c["envFrom"] == [{"secretRef": {"name": "more-env"}}], kind
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["model"]["mountPath"] == "/models" and mounts["cache"]["mountPath"] == "/opt/cache", kind
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "e5-large", kind
        # a model fetched at start: the init container runs before the worker, on the same volume
        assert [i["name"] for i in pod["initContainers"]] == ["fetch-model"], kind
        assert pod["initContainers"][0]["volumeMounts"] == [{"name": "model", "mountPath": "/models"}], kind
        assert volumes["cache"]["persistentVolumeClaim"]["claimName"] == "embedstream-cache", kind
    # off by default: the pod reads the export the image baked at its XDG_CACHE_HOME (a volume would hide it)
    dockerfile = (CHART.parents[1] / "Dockerfile").read_text()
    assert "XDG_CACHE_HOME=/opt/cache" in dockerfile
    pod = render(BASE)["Deployment"]["spec"]["template"]["spec"]
    assert "cache" not in {v["name"] for v in pod["volumes"]}
    pod = render(merge(BASE, {"cache": {"enabled": True}}))["Deployment"]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["cache"] == {"name": "cache", "emptyDir": {"sizeLimit": "2Gi"}}


#: Worker series a share-group member never moves (it commits no offsets, has no consumer lag and no
#: rebalances); a consumer-group member never moves the ``embedstream_share_*`` ones.
CONSUMER_ONLY = {"embedstream_consumer_lag", "embedstream_commit_seconds", "embedstream_commit_failures_total",
                 "embedstream_rebalances_total"}
ALERTS = {"consumer": {"EmbedstreamLagGrowing", "EmbedstreamStalled", "EmbedstreamDeadLetters", "EmbedstreamFenced",
                       "EmbedstreamRestarting", "EmbedstreamGpuIdle", "EmbedstreamNoWorker"},
          "share": {"EmbedstreamBacklogGrowing", "EmbedstreamStalled", "EmbedstreamRedeliveries",
                    "EmbedstreamLockExpiries", "EmbedstreamDeadLetters", "EmbedstreamFenced", "EmbedstreamRestarting",
                    "EmbedstreamGpuIdle", "EmbedstreamNoWorker"}}
MONITORED = {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
             "metrics": {"serviceMonitor": {"enabled": True}}}


def rendered_rules(mode: str, extra: dict | None = None) -> tuple[dict, dict[str, dict]]:
    values = merge(merge(BASE, MONITORED), SHARE if mode == "share" else {})
    objs = render(merge(values, extra or {}))
    [group] = objs["PrometheusRule"]["spec"]["groups"]
    return objs, {r["alert"]: r for r in group["rules"]}


def scraped_series(objs: dict, mode: str) -> set[str]:
    """Every series a target the chart has scraped serves in ``mode``: the workers' (their ServiceMonitor),
    and the backlog exporter's for the mode's kind of group (its own ServiceMonitor)."""
    from tools.metrics_docs import declared, exporter_declared

    worker = {name for name, *_ in declared()}
    share = {name for name in worker if name.startswith("embedstream_share_")}
    out: set[str] = set()
    if "ServiceMonitor" in objs:
        out |= worker - CONSUMER_ONLY if mode == "share" else worker - share
    if "ServiceMonitor/backlog" in objs:
        out |= {name for name, *_ in exporter_declared(mode)}
    return out


def test_alerts_are_off_by_default_and_each_rule_names_metrics_the_worker_serves():
    assert "PrometheusRule" not in render(BASE)
    operations = (CHART.parents[1] / "docs" / "operations.md").read_text()
    for mode in ("consumer", "share"):
        objs, alerts = rendered_rules(mode)
        rule = objs["PrometheusRule"]
        assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
        assert set(alerts) == ALERTS[mode], mode
        served = scraped_series(objs, mode)
        for name, r in alerts.items():
            notes = r["annotations"]
            assert notes["summary"] and notes["description"] and "runbook" not in notes, name
            assert notes["runbook_url"] == f"docs/operations.md#{name.lower()}", notes
            assert f"\n### {name}\n" in operations, f"docs/operations.md has no section for {name}"
            used = set(re.findall(r"embedstream_[a-z_]+", r["expr"]))
            assert used or name == "EmbedstreamRestarting", name  # kube-state-metrics' restarts
            # each series as scraped (histograms by _count/_bucket/_sum), from a target the chart scrapes
            missing = {re.sub(r"_(count|bucket|sum)$", "", m) for m in used} - served
            assert not missing, (mode, name, missing)
            assert 'namespace="ml"' in r["expr"] or name == "EmbedstreamRestarting", r["expr"]
            assert r["expr"].count("(") == r["expr"].count(")"), r["expr"]
    _, alerts = rendered_rules("share", {"prometheusRule": {"runbookBaseUrl": "https://wiki.example.com/embedstream"}})
    assert alerts["EmbedstreamLockExpiries"]["annotations"]["runbook_url"] == (
        "https://wiki.example.com/embedstream#embedstreamlockexpiries")


def _promtool() -> str | None:
    import shutil

    local = CHART.parents[1] / ".venv" / "bin" / "promtool"
    return str(local) if local.exists() else shutil.which("promtool")


WORKER_POD = 'namespace="ml", pod="es-embedstream-6d8f9-x2x7q"'
BACKLOG_POD = 'namespace="ml", pod="es-embedstream-backlog-7c5d4-k9p2m"'
#: What a mode's input waits on, as the backlog exporter serves it: a consumer group's lag, a share group's backlog.
WAITING = {"consumer": f'embedstream_group_topic_lag{{{BACKLOG_POD}, group="embedstream", topic="documents"}}',
           "share": f'embedstream_share_topic_backlog{{{BACKLOG_POD}, group="emb", topic="docs"}}'}


def _waiting_cases(mode: str, growing: str, progress: str) -> list[tuple]:
    """The mode's growing-input alert (input rising, then flat) and its stall (no progress while input
    waits, then progress)."""
    waiting = WAITING[mode]
    return [(growing, "25m", [(waiting, "100+50x40")], [(waiting, "100+0x40")]),
            ("EmbedstreamStalled", "20m", [(progress, "7+0x40"), (waiting, "100+0x40")],
             [(progress, "7+30x40"), (waiting, "100+0x40")]),
            # records wait and no worker answers a scrape: the exporter's up and a down worker's do not count
            ("EmbedstreamNoWorker", "20m", [(waiting, "100+0x40"), (f"up{{{BACKLOG_POD}}}", "1x40"),
                                            (f"up{{{WORKER_POD}}}", "0x40")],
             [(waiting, "100+0x40"), (f"up{{{WORKER_POD}}}", "0x5 1x35")])]


#: Each alert with a synthetic series that must make it fire and one that must not, as Prometheus' own
#: rule-test runner reads them: (alert, eval time, input series that fire it, input series that do not).
RULE_CASES = {
    "consumer": _waiting_cases("consumer", "EmbedstreamLagGrowing",
                               f'embedstream_commit_seconds_count{{{WORKER_POD}, mode="async"}}'),
    "share": [
        *_waiting_cases("share", "EmbedstreamBacklogGrowing",
                        f'embedstream_share_acknowledgements_total{{{WORKER_POD}, type="accept"}}'),
        ("EmbedstreamRedeliveries", "25m",  # 2 a second, over the threshold of 1; then 0.5 a second
         [(f"embedstream_share_redeliveries_total{{{WORKER_POD}}}", "0+120x40")],
         [(f"embedstream_share_redeliveries_total{{{WORKER_POD}}}", "0+30x40")]),
        ("EmbedstreamLockExpiries", "15m",
         [(f"embedstream_share_lock_expiries_total{{{WORKER_POD}}}", "0x10 3+0x30")],
         [(f"embedstream_share_lock_expiries_total{{{WORKER_POD}}}", "0+0x40")]),
    ],
}


#: The alerts of both modes (the GPU's rule reads what the mode waits on: lag, or the backlog).
COMMON_CASES = [
    ("EmbedstreamDeadLetters", "25m",  # 2 a second over 10 minutes, over the threshold of 1
     [(f'embedstream_dlq_messages_total{{{WORKER_POD}, reason="decode_error"}}', "0+120x40")],
     [(f'embedstream_dlq_messages_total{{{WORKER_POD}, reason="decode_error"}}', "0+6x40")]),
    ("EmbedstreamFenced", "15m",
     [(f"embedstream_fenced_records_total{{{WORKER_POD}}}", "0x10 4+0x30")],
     [(f"embedstream_fenced_records_total{{{WORKER_POD}}}", "0+0x40")]),
    ("EmbedstreamRestarting", "20m",
     [(f'kube_pod_container_status_restarts_total{{{WORKER_POD}, container="worker"}}', "0x5 1x5 2x5 3x30")],
     [(f'kube_pod_container_status_restarts_total{{{WORKER_POD}, container="worker"}}', "0x5 1x35")]),
]
def _gpu_case(mode: str) -> tuple:
    util = f'embedstream_gpu_utilization_ratio{{{WORKER_POD}, gpu="0"}}'
    return ("EmbedstreamGpuIdle", "25m", [(util, "0.05x40"), (WAITING[mode], "100+50x40")],
            [(util, "0.9x40"), (WAITING[mode], "100+50x40")])


@pytest.mark.parametrize("mode", ["consumer", "share"])
def test_each_alert_fires_on_a_series_that_must_fire_it_and_not_on_one_that_must_not(mode, tmp_path):
    """The rendered rules, run by Prometheus' own rule-test runner (``promtool test rules``; `make setup-dev`
    builds it): each alert of the mode on a synthetic series that must fire it, and on one that must not,
    with the labels and annotations the rule gives it."""
    import subprocess

    promtool = _promtool()
    if promtool is None:
        missing_tool("Prometheus' rule-test runner (promtool) is not installed: `make setup-dev` builds it when Go is "
                     "on the PATH; the rules' series and labels are still checked by the test before this one")
    _, alerts = rendered_rules(mode)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "embedstream", "rules": list(
        alerts.values())}]}))
    tests = []
    cases = [*RULE_CASES[mode], *COMMON_CASES, _gpu_case(mode)]
    assert {c[0] for c in cases} == set(alerts), "an alert without its rule test"
    for alert, at, fire, calm in cases:
        rule = alerts[alert]
        expected = [{"exp_labels": dict(rule["labels"]), "exp_annotations": dict(rule["annotations"])}]
        for series, exp in ((fire, expected), (calm, [])):
            tests.append({"interval": "1m", "input_series": [{"series": k, "values": v} for k, v in series],
                          "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": exp}]})
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                         "tests": tests}))
    run = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "SUCCESS" in run.stdout + run.stderr


def test_the_backlog_exporter_is_scraped_and_gets_extra_volumes_and_only_what_it_reads():
    objs = render(merge(merge(BASE, MONITORED), merge(SHARE, {
        "extraVolumes": [{"name": "ca", "secret": {"secretName": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/corp-ca"}],
        "milvus": {"tls": {"existingSecret": "milvus-ca"}}, "redis": {"enabled": True, "existingSecret": "r"}})))
    monitor = objs["ServiceMonitor/backlog"]
    kubernetes_validate.validate(objs["Deployment/backlog"], "1.30", strict=True)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= objs["Service/backlog"]["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in objs["Service/backlog"]["spec"][
        "ports"]]
    pod = objs["Deployment/backlog"]["spec"]["template"]["spec"]
    assert {"name": "ca", "secret": {"secretName": "corp-ca"}} in pod["volumes"]
    [c] = pod["containers"]
    assert {"name": "ca", "mountPath": "/etc/corp-ca"} in c["volumeMounts"]
    env = {e["name"] for e in c["env"]}
    assert env == {"EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS", "EMBEDSTREAM_INPUT_TOPIC", "EMBEDSTREAM_GROUP_ID",
                   "EMBEDSTREAM_GROUP_TYPE", "EMBEDSTREAM_LOG_FORMAT"}, env
    # a consumer group's: its lag, counted as KEDA is told to count it, scraped for the alerts; optional
    consumer = render(merge(merge(BASE, MONITORED), {"keda": {"offsetResetPolicy": "latest"}}))
    [c] = consumer["Deployment/backlog"]["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["lag", "--serve", "9400", "--interval", "30", "--offset-reset-policy", "latest"]
    assert {e["name"]: e.get("value") for e in c["env"]}["EMBEDSTREAM_GROUP_TYPE"] == "consumer"
    assert "ServiceMonitor/backlog" in consumer and "ScaledObject" in consumer
    assert "ServiceMonitor/backlog" not in render(merge(merge(BASE, MONITORED), {"lagExporter": {"enabled": False}}))


def _object_paths(schema: dict, path: tuple = ()) -> list[tuple]:
    """Every path of the values schema at which an object takes only the keys it names."""
    out = [path] if schema.get("additionalProperties") is False and "properties" in schema else []
    for key, sub in schema.get("properties", {}).items():
        if isinstance(sub, dict):
            out += _object_paths(sub, (*path, key))
    return out


def _nested(path: tuple, leaf: dict) -> dict:
    for key in reversed(path):
        leaf = {key: leaf}
    return leaf


SCHEMA_PATHS = _object_paths(__import__("json").loads((CHART / "values.schema.json").read_text()))


@pytest.mark.parametrize("path", SCHEMA_PATHS, ids=lambda p: ".".join(p) or "<top>")
def test_a_typo_at_any_level_of_the_values_fails_to_render(path):
    assert len(SCHEMA_PATHS) > 25  # every level, not a few sections
    with pytest.raises(HelmError):
        render(merge(BASE, _nested(path, {"enabeld": True})))


def test_probes_scheduling_and_runtime_are_the_operators_to_set():
    objs = render(merge(BASE, {
        "probes": {"startup": {"failureThreshold": 120}, "liveness": {"periodSeconds": 20, "timeoutSeconds": 3}},
        "priorityClassName": "gpu-batch", "runtimeClassName": "nvidia",
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "{{ .Release.Name }}"}}}],
    }))
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["startupProbe"]["failureThreshold"] == 120 and c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert (c["livenessProbe"]["periodSeconds"], c["livenessProbe"]["timeoutSeconds"]) == (20, 3)
    assert c["readinessProbe"] == {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5,
                                   "timeoutSeconds": 1, "failureThreshold": 2}
    assert pod["priorityClassName"] == "gpu-batch" and pod["runtimeClassName"] == "nvidia"
    [spread] = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "es"  # templated
    defaults = render(BASE)["Deployment"]["spec"]["template"]["spec"]
    assert not {"priorityClassName", "runtimeClassName", "topologySpreadConstraints"} & set(defaults)
    assert defaults["containers"][0]["startupProbe"]["failureThreshold"] == 60  # 300 s for the model


def test_keda_falls_back_on_no_data_and_scales_down_slowly():
    so = render(BASE)["ScaledObject"]["spec"]
    assert so["fallback"] == {"failureThreshold": 3, "replicas": 1}
    down = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down == {"stabilizationWindowSeconds": 300, "policies": [{"type": "Percent", "value": 50,
                                                                      "periodSeconds": 60}]}
    off = render(merge(BASE, {"keda": {"fallback": {"enabled": False}}}))["ScaledObject"]["spec"]
    assert "fallback" not in off


def test_each_migration_run_is_a_job_of_its_own_that_cleans_up_and_no_worker_selector_picks():
    first = render(merge(BASE, {"migration": {"model": "/models/e5"}}))
    drop = render(merge(BASE, {"migration": {"model": "/models/e5", "args": ["--drop-old"]}}))
    assert first["Job"]["metadata"]["name"] != drop["Job"]["metadata"]["name"]  # a Job's template cannot change
    assert first["Job"]["spec"]["ttlSecondsAfterFinished"] == 86400
    job_labels = first["Job"]["spec"]["template"]["metadata"]["labels"]
    for selector in (first["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
                     first["Service"]["spec"]["selector"],
                     first["Deployment"]["spec"]["selector"]["matchLabels"]):
        assert not all(job_labels.get(k) == v for k, v in selector.items()), selector


def test_every_gpu_a_pod_asks_for_gets_processes_and_the_partitions_must_hold_them():
    objs = render(merge(BASE, {"gpu": {"enabled": True, "count": 2, "workersPerGpu": 4},
                               "keda": {"partitions": 24, "maxReplicaCount": 3}}))
    env = env_of(objs)
    assert env["EMBEDSTREAM_PROCESSES"]["value"] == "8"  # 2 GPUs x 4
    assert env["CUDA_VISIBLE_DEVICES"]["value"] == "0,1"  # run --processes shares them out in turn
    assert "CUDA_VISIBLE_DEVICES" not in env_of(render(merge(BASE, VALUE_SETS["GPU"])))  # one GPU: as given
    with pytest.raises(HelmError, match="partitions"):
        render(merge(BASE, {"gpu": {"enabled": True, "count": 2, "workersPerGpu": 4},
                            "keda": {"partitions": 12, "maxReplicaCount": 3}}))  # 24 processes, 12 partitions


EXAMPLE = CHART / "examples" / "own-kafka-sasl-ssl-2-gpus-alerts.yaml"


def test_the_operations_pages_values_file_renders_valid_objects_and_is_the_one_shown():
    values = yaml.safe_load(EXAMPLE.read_text())
    objs = render(merge(values, {"keda": {"checkCRDs": False}}))  # rendered offline: no cluster's CRDs here
    for obj in objs.values():
        if obj["kind"] in CORE_KINDS | {"Job"}:
            kubernetes_validate.validate(obj, "1.30", strict=True)
    env = env_of(objs)
    assert env["EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert env["EMBEDSTREAM_PROCESSES"]["value"] == "8" and env["CUDA_VISIBLE_DEVICES"]["value"] == "0,1"
    assert {"ScaledObject", "TriggerAuthentication", "PrometheusRule", "ServiceMonitor"} <= set(objs)
    page = (CHART.parents[1] / "docs" / "operations.md").read_text()
    assert EXAMPLE.read_text().strip() in page, "docs/operations.md shows the example values file as it is"


def test_oauthbearer_and_mutual_tls_reach_the_worker_and_kedas_trigger():
    objs = render(merge(BASE, VALUE_SETS["OAUTHBEARER (OIDC) and mutual TLS"]))
    env = env_of(objs)
    assert env["EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert env["EMBEDSTREAM_KAFKA__SASL_MECHANISM"]["value"] == "OAUTHBEARER"
    assert env["EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_METHOD"]["value"] == "oidc"
    assert env["EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL"]["value"] == "https://idp.example.com/token"
    assert env["EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_CLIENT_SECRET"]["valueFrom"]["secretKeyRef"] == \
        {"name": "kafka-oidc", "key": "password"}
    assert "EMBEDSTREAM_KAFKA__SASL_PASSWORD" not in env
    assert env["EMBEDSTREAM_KAFKA__SSL_CERTIFICATE_LOCATION"]["value"] == "/etc/embedstream/kafka-tls/tls.crt"
    assert env["EMBEDSTREAM_KAFKA__SSL_KEY_LOCATION"]["value"] == "/etc/embedstream/kafka-tls/tls.key"
    [trigger] = objs["ScaledObject"]["spec"]["triggers"]
    md = trigger["metadata"]
    assert (md["sasl"], md["oauthTokenEndpointUri"], md["scopes"], md["tls"]) == \
        ("oauthbearer", "https://idp.example.com/token", "kafka", "enable")
    refs = {r["parameter"]: (r["name"], r["key"]) for r in objs["TriggerAuthentication"]["spec"]["secretTargetRef"]}
    assert refs == {"username": ("kafka-oidc", "username"), "password": ("kafka-oidc", "password"),
                    "ca": ("kafka-mtls", "ca.crt"), "cert": ("kafka-mtls", "tls.crt"), "key": ("kafka-mtls", "tls.key")}
    with pytest.raises(HelmError):  # OAUTHBEARER without its token endpoint
        render(merge(BASE, {"kafka": {"sasl": {"enabled": True, "mechanism": "OAUTHBEARER",
                                               "existingSecret": "kafka-oidc"}}}))


def test_a_cluster_without_kedas_crds_stops_the_install_saying_what_to_do():
    with pytest.raises(HelmError, match="install KEDA first"):
        render(merge(BASE, {"keda": {"checkCRDs": True}}))  # this engine serves no keda.sh/v1alpha1
    assert "Deployment" in render(merge(BASE, {"keda": {"checkCRDs": True, "enabled": False}}))  # an HPA then


# -- the chart's output is the worker's input ---------------------------------------------------------
LARGE = {"batching": {"maxTextBytes": 4_000_000, "maxBatchTokens": 2_000_000},
         "redis": {"enabled": True, "url": "redis://cache:6379/0", "cacheTtlSeconds": 31_536_000},
         "kafka": {"sessionTimeoutMs": 1_000_000, "extraProperties": {"message.max.bytes": 5_000_000,
                                                                     "linger.ms": 5}},
         "keda": {"lagThreshold": 1_000_000, "activationLagThreshold": 2_000_000},
         "chunking": {"maxChunks": 1_000_000}, "models": {"memoryMb": 1_048_576}}
RELEASES = {
    "defaults": {},
    **{f"example {p.name}": yaml.safe_load(p.read_text()) for p in sorted((CHART / "examples").glob("*.yaml"))},
    "share group with its backlog exporter": {"kafka": {"groupType": "share"}},
    "exactly-once": {"kafka": {"delivery": "exactly-once"}},
    "2 GPUs": {"gpu": {"enabled": True, "count": 2}, "keda": {"partitions": 48}},
    "SASL and mutual TLS": VALUE_SETS["OAUTHBEARER (OIDC) and mutual TLS"],
    "migration Job": VALUE_SETS["migration Job, named alias"],
    "migration as a lane": merge(VALUE_SETS["migration Job, named alias"], {"migration": {"mode": "lane"}}),
    "large numbers everywhere a number goes": LARGE,
    "a Milvus database over mutual TLS": {"milvus": {"dbName": "search", "tls": {"existingSecret": "m",
                                                                                 "clientCert": True}}},
    "large numbers, share mode, metrics-api": merge(LARGE, {"kafka": {"groupType": "share"}}),
}


def containers(objs: dict[str, dict]):
    """``(workload, container)`` for every container of every rendered workload (init containers too)."""
    for kind, obj in objs.items():
        if kind.split("/")[0] not in ("Deployment", "Job"):
            continue
        pod = obj["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            yield kind, c


@pytest.mark.parametrize("extra", list(RELEASES.values()), ids=list(RELEASES))
def test_every_rendered_container_is_accepted_by_the_worker_s_own_parsers(extra, monkeypatch):
    """Helm writes 1,000,000 and up as 1e+06 unless told otherwise: the defaults' maxTextBytes crash-looped
    every pod. Each container's env goes through the worker's settings, and its args through the CLI,
    as the pod would run them; KEDA's trigger metadata is checked as KEDA parses it."""
    from typer.testing import CliRunner

    from worker.commands.cli import app
    from worker.settings import load_settings

    objs = render(merge(BASE, extra))
    seen = 0
    for kind, c in containers(objs):
        env = container_env(c, lambda e: "stand-in-" + e["name"].lower())  # a Secret's key or a pod field
        assert not [k for k, v in env.items() if re.fullmatch(r"-?\d+(\.\d+)?e[+-]\d+", v)], (kind, env)
        for key in [k for k in os.environ if k.startswith("EMBEDSTREAM_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        load_settings()  # raises on any value the worker cannot take
        parsed: list[object] = []

        def parsed_then_stop(overrides=None, parsed=parsed, **more):
            parsed.append(load_settings({**(overrides or {}), **more}))
            raise SystemExit(0)

        for module in ("run", "lag", "migrate"):
            monkeypatch.setattr(f"worker.commands.cli.{module}.settings_or_exit", parsed_then_stop)
        args = [*c.get("command", [])[1:], *c.get("args", [])] if c.get("command") else c.get("args", [])
        result = CliRunner().invoke(app, args, env=env)
        assert result.exit_code == 0 and parsed, (kind, args, result.output)
        seen += 1
    assert seen >= 1
    for kind, obj in objs.items():
        if kind.split("/")[0] == "ScaledObject":
            for trigger in obj["spec"]["triggers"]:
                check_keda_metadata(trigger)


#: KEDA's parsing of each trigger's metadata (its scalers' typed fields): integers, floats, booleans.
KEDA_INTEGERS = {"lagThreshold", "activationLagThreshold"}
KEDA_FLOATS = {"targetValue", "activationTargetValue", "threshold", "activationThreshold"}
KEDA_BOOLEANS = {"limitToPartitionsWithLag", "allowIdleConsumers", "excludePersistentLag",
                 "scaleToZeroOnInvalidOffset", "unsafeSsl"}


def check_keda_metadata(trigger: dict) -> None:
    md = trigger["metadata"]
    for key, value in md.items():
        assert isinstance(value, str), (key, value)  # metadata is map[string]string
        if key in KEDA_INTEGERS:
            assert re.fullmatch(r"-?\d+", value), (key, value)  # strconv.ParseInt
        elif key in KEDA_FLOATS:
            assert re.fullmatch(r"-?\d+(\.\d+)?", value), (key, value)  # resource.Quantity / ParseFloat
        elif key in KEDA_BOOLEANS:
            assert value in ("true", "false"), (key, value)  # strconv.ParseBool
        elif key == "tls" and trigger["type"] == "kafka":
            assert value in ("enable", "disable"), value  # the Kafka scaler's own words


def test_a_milvus_database_and_mutual_tls_reach_the_worker_and_the_migration_job():
    objs = render(merge(BASE, {"milvus": {"dbName": "search", "tls": {"existingSecret": "milvus-mtls",
                                                                      "clientCert": True}},
                               "migration": {"model": "/models/e5-small"}}))
    for kind in ("Deployment", "Job"):
        pod = objs[kind]["spec"]["template"]["spec"]
        c = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["EMBEDSTREAM_MILVUS_DB_NAME"] == "search", kind
        assert env["EMBEDSTREAM_MILVUS_TLS_CA_FILE"] == "/etc/embedstream/milvus-tls/ca.crt", kind
        assert env["EMBEDSTREAM_MILVUS_TLS_CERT_FILE"] == "/etc/embedstream/milvus-tls/tls.crt", kind
        assert env["EMBEDSTREAM_MILVUS_TLS_KEY_FILE"] == "/etc/embedstream/milvus-tls/tls.key", kind
        assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["milvus-tls"] == "/etc/embedstream/milvus-tls"
        assert {v["name"]: v for v in pod["volumes"]}["milvus-tls"]["secret"]["secretName"] == "milvus-mtls"
    env = env_of(render(BASE))
    assert not {"EMBEDSTREAM_MILVUS_DB_NAME", "EMBEDSTREAM_MILVUS_TLS_CA_FILE"} & set(env)


def test_the_network_policy_lets_in_only_prometheus_the_kubelet_and_keda_on_the_http_ports():
    assert "NetworkPolicy" not in render(BASE)
    objs = render({**BASE, "networkPolicy": {"enabled": True, "nodeCIDRs": ["10.0.0.0/16"]},
                   "gpu": {"enabled": True, "count": 1, "workersPerGpu": 2},
                   "kafka": {**BASE["kafka"], "groupType": "share"}})
    worker, backlog = objs["NetworkPolicy"], objs["NetworkPolicy/backlog"]
    [rule] = worker["spec"]["ingress"]
    assert worker["spec"]["policyTypes"] == ["Ingress"]
    assert rule["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus"}}}, {"ipBlock": {"cidr": "10.0.0.0/16"}}]
    assert [p["port"] for p in rule["ports"]] == [9400, 9401]  # one per process
    assert worker["spec"]["podSelector"]["matchLabels"].items() <= \
        objs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    [rule] = backlog["spec"]["ingress"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in rule["from"]
    assert backlog["spec"]["podSelector"]["matchLabels"].items() <= \
        objs["Deployment/backlog"]["spec"]["template"]["metadata"]["labels"].items()


def test_helm_test_runs_the_check_with_the_workers_settings_where_a_worker_runs():
    """`helm test`'s pod: `run --check` with every setting the worker gets, off the worker's selector
    (the PDB and the metrics Service), and on a GPU release placed as a worker with one GPU."""
    objs = render(merge(BASE, VALUE_SETS["SASL + TLS"]))
    pod = objs["Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    [check] = pod["spec"]["containers"]
    worker = objs["Deployment"]["spec"]["template"]["spec"]
    assert check["args"] == ["run", "--check"]
    assert check["env"] == worker["containers"][0]["env"] and check["image"] == worker["containers"][0]["image"]
    assert check["volumeMounts"] == worker["containers"][0]["volumeMounts"]
    assert pod["spec"]["volumes"] == worker["volumes"]
    selector = objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= pod["metadata"]["labels"].items()
    gpu = render(merge(BASE, {"gpu": {"enabled": True, "count": 2}, "runtimeClassName": "nvidia",
                              "keda": {"maxReplicaCount": 1, "partitions": 8},
                              "nodeSelector": {"pool": "gpu"}}))["Pod"]["spec"]
    assert gpu["runtimeClassName"] == "nvidia" and gpu["nodeSelector"] == {"pool": "gpu"}
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    notes = _engine.render(str(CHART), BASE, name="es", namespace="ml")
    assert any("helm test es" in text for name, text in notes.items() if name.endswith("NOTES.txt"))


def _values_path_exists(values: dict, path: str) -> bool:
    cur = values
    for part in path.split("."):
        if part == "*" and isinstance(cur, dict):
            return True
        if not (isinstance(cur, dict) and part in cur):
            return False
        cur = cur[part]
    return True


def test_every_values_key_the_chart_s_comments_and_the_operations_table_name_is_one_the_chart_has():
    """A comment in values.yaml that names another value (``keda.offsetResetPolicy``), and each key the
    operations page's values table lists (``cache.enabled``, ``.existingClaim`` for its siblings), is a
    key of values.yaml: a renamed or removed value leaves no text pointing at it."""
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    named = re.compile(r"(?<![\w./-])([a-z][A-Za-z0-9]*(?:\.(?:[a-zA-Z][A-Za-z0-9]*|\*))+)(?![\w/])")
    wrong = [(n, m.group(1)) for n, line in enumerate(text.splitlines(), 1) if "#" in line
             for m in named.finditer(line[line.index("#"):])
             if m.group(1).split(".")[0] in values and not _values_path_exists(values, m.group(1))]
    assert not wrong, f"values.yaml's comments name values it does not have: {wrong}"
    seen = 0
    for line in (CHART.parents[1] / "docs" / "operations.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        full: list[str] = []  # the cell's full paths so far: a ".key" is a sibling of one of them
        for token in re.findall(r"`([^`]+)`", line.split("|")[1]):
            token = re.split(r"[:=]", token)[0].strip()
            if token.startswith(".") and full:
                near = [p.rsplit(".", i)[0] + token for p in reversed(full) for i in (1, 2) if p.count(".") >= i - 1]
                token = next((t for t in near if _values_path_exists(values, t)), near[0])
            elif token.split(".")[0] not in values:
                continue
            else:
                full.append(token)
            seen += 1
            assert _values_path_exists(values, token), f"docs/operations.md lists {token!r}, not a value: {line[:120]}"
    assert seen > 50  # the table was read
