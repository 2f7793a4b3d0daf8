# embedstream worker image.
#   GPU (default): docker build -t embedstream:gpu .
#   CPU:           docker build -t embedstream:cpu --build-arg BASE=python:3.11-slim --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu \
#                    --build-arg EXTRAS=int8 .
#   EXTRAS=int8 adds OpenVINO and onnxruntime (EMBEDSTREAM_PRECISION=int8) and exports the int8 model at build time.
#   The model is downloaded once at build time and baked in at /opt/model (scale-from-zero pods
#   start without a download); pick another with --build-arg MODEL=<hub name>.
# Not built in this repository's CI: the machines it runs on have no Docker engine.
ARG BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
FROM ${BASE} AS runtime

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu124
ARG MODEL=sentence-transformers/all-MiniLM-L6-v2
# gpu: nvidia-ml-py, for the GPU gauges on /metrics; the CPU build replaces it (EXTRAS=int8).
ARG EXTRAS="gpu"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    HF_HOME=/opt/hf HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false XDG_CACHE_HOME=/opt/cache

# The CUDA base has no Python; python:3.11-slim has one.
RUN if ! python3 -m venv --help >/dev/null 2>&1; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /app
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY schemas ./schemas
COPY connectors ./connectors
RUN pip install --index-url ${TORCH_INDEX} torch \
 && pip install ".${EXTRAS:+[${EXTRAS}]}" \
 && if [ -n "${MODEL}" ]; then \
      HF_HUB_OFFLINE=0 python -c "import os, sys; from sentence_transformers import SentenceTransformer as S; \
S(sys.argv[1]).save('/opt/model')" "${MODEL}"; \
    fi \
 && if [ -n "${MODEL}" ] && [ "${EXTRAS}" = "int8" ]; then \
      python -c "from worker.embedding.sentence import SentenceTransformerEmbedder as E; E('/opt/model', 'int8', 'cpu')"; \
    fi

# The model baked in above; override EMBEDSTREAM_MODEL to use another path.
ENV EMBEDSTREAM_MODEL=/opt/model
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin embedstream
USER 10001
EXPOSE 9400
ENTRYPOINT ["embedstream"]
CMD ["run"]
