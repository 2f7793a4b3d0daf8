# embedstream worker image.
#   GPU (default): docker build -t embedstream:gpu .
#   CPU:           docker build -t embedstream:cpu --build-arg VARIANT=cpu .
# Both install with docker/install-worker.sh, which CI runs too (tools/check_install.py): PyPI's torch at the
# version the suite passed on (constraints.txt; on Linux it is a CUDA build whose wheels carry the CUDA
# runtime, so no CUDA base image is needed), the GPU gauges (gpu) or the int8 runtimes (cpu).
# The default model (all-MiniLM-L6-v2) comes with the package; --build-arg MODEL=<hub name> bakes another
# into /opt/model at build time (scale-from-zero pods start without a download). The CPU variant exports
# the int8 model at build time, with OpenVINO's compiled copy beside it, readable by the worker's user.
# CI builds both variants with podman (make image-check, tools/image_check.py) and runs the CPU one's
# container as the chart runs its pod.
ARG BASE=python:3.11-slim
FROM ${BASE} AS runtime
# A CA bundle for the build's downloads where a proxy inspects TLS: mount it and name it, e.g.
#   podman build -v "$PIP_CERT:/etc/build-ca.pem:ro" --build-arg PIP_CERT=/etc/build-ca.pem .
# pip reads it from the environment during the build's RUN steps; it is never copied into the image.
ARG PIP_CERT

ARG VARIANT=gpu
ARG MODEL=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    HF_HOME=/opt/hf HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false XDG_CACHE_HOME=/opt/cache

WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY docker/install-worker.sh ./docker/
COPY worker ./worker
COPY schemas ./schemas
COPY connectors ./connectors
RUN sh docker/install-worker.sh /opt/venv "${VARIANT}" /app
ENV PATH=/opt/venv/bin:$PATH
RUN if [ -n "${MODEL}" ]; then \
      HF_HUB_OFFLINE=0 python -c "import sys; from sentence_transformers import SentenceTransformer as S; \
S(sys.argv[1]).save('/opt/model')" "${MODEL}"; \
    fi \
 && if [ "${VARIANT}" = "cpu" ]; then \
      python -c "import sys; from worker.embedding.sentence import SentenceTransformerEmbedder as E; \
E(sys.argv[1] or None, 'int8', 'cpu')" "${MODEL:+/opt/model}" \
      && chmod -R a+rX /opt/cache; \
    fi
# A baked model is the default; unset, the packaged one is.
ENV EMBEDSTREAM_MODEL=${MODEL:+/opt/model}
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin embedstream
USER 10001
EXPOSE 9400
ENTRYPOINT ["embedstream"]
CMD ["run"]
