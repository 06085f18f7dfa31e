# The GPU image: NGC Triton (Python backend) + CUDA torch + transformers + xgrammar + the specgram engine and
# the model repository. Checkpoints are NOT baked in: mount a HF checkpoint folder at /models/target.
#
#   docker build -t specgram-triton .
#   docker run --gpus all --shm-size=1g -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#       -v /path/to/checkpoint:/models/target:ro specgram-triton
#
# The image has not been built or run yet; the test suite lints this file with hadolint
# (tests/unit/test_deploy_files.py). docs/gpu.md ("Container") says what is and is not verified.

# 24.12: Triton 2.53, CUDA 12.6, Ubuntu 24.04 with Python 3.12 (the Python backend stub's interpreter).
FROM nvcr.io/nvidia/tritonserver:24.12-py3

# Ubuntu 24.04's system Python is "externally managed" (PEP 668); this image is the environment.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/specgram

# torch: the CUDA 12.6 build, pinned (requirements.txt pins the CPU build of the same version).
RUN pip install --index-url https://download.pytorch.org/whl/cu126 torch==2.13.0

COPY requirements-gpu.txt ./
RUN pip install -r requirements-gpu.txt

COPY backend/ backend/
RUN pip install --no-deps ./backend

COPY model_repository/ model_repository/

# The `llm` model reads its checkpoint from here (overrides config.pbtxt's relative path).
# SPECGRAM_DRAFT_CHECKPOINT likewise names a draft model folder, if one is mounted.
ENV SPECGRAM_CHECKPOINT=/models/target
VOLUME ["/models"]

EXPOSE 8000 8001 8002

# Ready = the server is up and every model (here: llm) is loaded. Loading a large checkpoint takes minutes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"]

CMD ["tritonserver", "--model-repository=/opt/specgram/model_repository"]
