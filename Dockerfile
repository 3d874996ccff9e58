# syntax=docker/dockerfile:1
# picker container image: `docker build -t picker:dev .` then `docker run picker:dev --help`.
# Two stages: the builder makes a virtualenv from prebuilt wheels pinned by constraints.txt and compiles picker's
# C extension; the final stage is the same slim Python with only that venv copied in (no pip cache, no compiler,
# no source tree).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# Dependencies first, in their own layer: it is rebuilt only when pyproject.toml or constraints.txt change.
# --only-binary keeps every dependency a prebuilt wheel, so the builder needs no compiler either.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['kube']))" > /tmp/requirements.txt \
 && pip install --no-cache-dir --only-binary=:all: -c constraints.txt -r /tmp/requirements.txt

# The compiler for picker's C extension (picker/scheduling/_native.c: the scheduling hot path's inner loops), in
# this stage only. Python's headers: the official image has them; Debian's python3.11 needs python3.11-dev.
# Unpinned: the compiler does not reach the final image, and a pinned Debian version breaks when the mirror moves.
# cargo-web: Debian's current Rust (bookworm's plain cargo is 1.63, older than native/front needs), for the ext_proc
# port's native front.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev cargo-web \
 && if [ ! -f "$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
      apt-get install -y --no-install-recommends python3.11-dev; \
    fi \
 && rm -rf /var/lib/apt/lists/*

# The native ext_proc front (HTTP/2 and gRPC off the GIL), crates from crates.io at Cargo.lock's versions; its own
# layer, before picker's source, so a change to the Python does not rebuild it.
COPY native/front ./native/front
RUN cargo build --release --locked --manifest-path native/front/Cargo.toml \
 && cp native/front/target/release/libpicker_front.so /src/_front.abi3.so \
 && rm -rf native/front/target /root/.cargo/registry

# Then picker itself (no dependency resolution: they are all in the layer above). The build fails if the
# extensions did not compile: the image must not fall back to the pure-Python path or grpc.aio unnoticed.
COPY README.md setup.py ./
COPY picker ./picker
RUN cp /src/_front.abi3.so picker/extproc/ \
 && pip install --no-cache-dir --no-deps . \
 && python -m compileall -q /opt/venv \
 && python -P -c "from picker.scheduling import native; from picker.kvcache import index, keys; from picker.extproc import native as front; assert native.NATIVE and index.NATIVE and keys.NATIVE, 'C extension missing'; assert front.AVAILABLE, 'native front missing'" \
 && picker --version

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="picker" \
      org.opencontainers.image.description="Inference-aware endpoint picker (Gateway API Inference Extension EPP)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

COPY --from=builder /opt/venv /opt/venv
# The chart runs with a read-only root filesystem: bytecode is precompiled above and never written at run time.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# 65532 is the conventional "nonroot" uid/gid; numeric so Kubernetes runAsNonRoot can verify it.
USER 65532:65532
WORKDIR /tmp
# ext_proc gRPC, gRPC health, Prometheus metrics
EXPOSE 9002 9003 9090
ENTRYPOINT ["picker", "serve"]
