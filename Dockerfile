# The greenctl executor/dispatcher image that `greenctl export k8s` manifests point at.
#   docker build -t greenctl-executor:0.1.0 .
# A plain `pip install torch` on Linux brings a CUDA build: the NVIDIA container toolkit
# supplies the driver, so the same image serves CPU, whole-GPU, MIG and MPS pods.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 GREENCTL_DB=/var/lib/greenctl/greenctl.db
WORKDIR /opt/greenctl
COPY pyproject.toml README.md ./
COPY cli cli
COPY data data
COPY planner planner
COPY profiler profiler
COPY executor executor
RUN pip install --no-cache-dir torch && pip install --no-cache-dir . && mkdir -p /var/lib/greenctl && chown 65534:65534 /var/lib/greenctl
EXPOSE 8080
USER 65534:65534
CMD ["python", "-m", "greenctl.executor.runtime.daemon", "--help"]
