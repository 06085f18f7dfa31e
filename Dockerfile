# Stub until the GPU issue (#6): the intended image, not yet built or verified anywhere.
# Plan: NGC Triton image (pinned tag) + pinned CUDA torch, transformers, xgrammar, the engine package, and
# the model repository; checkpoints mounted as a volume (see README "Container").
FROM nvcr.io/nvidia/tritonserver:24.10-py3
WORKDIR /opt/specgram
COPY requirements.txt ./
# torch comes as the CUDA build matching the image; the CPU pin in requirements.txt is for the dev machines.
RUN pip install --no-cache-dir torch==2.5.1 transformers==5.24.0 safetensors==0.8.0 xgrammar==0.2.9
COPY backend/ backend/
RUN pip install --no-cache-dir --no-deps ./backend
COPY model_repository/ model_repository/
ENV SPECGRAM_CHECKPOINT=/models/checkpoint
CMD ["tritonserver", "--model-repository=/opt/specgram/model_repository"]
