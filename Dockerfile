# syntax=docker/dockerfile:1
# Dockerfile - kvserve images.
#
#   docker build -t kvserve:cuda .                # default target: CUDA runtime image
#   docker build -t kvserve:cpu --target cpu .    # CPU-only image on debian:12
#   docker run --gpus all -p 8000:8000 kvserve:cuda
#   docker run -p 8000:8000 kvserve:cpu
#
# Each image holds only the kvserve binary, the shared libraries it links
# (collected with ldd in the build stage; the CUDA runtime, cuBLAS and NCCL
# come from the nvidia/cuda runtime base, libcuda from the host driver via
# the NVIDIA container toolkit) and the default model. It runs as the
# unprivileged user "kvserve", listens on 0.0.0.0:8000 and answers the
# HEALTHCHECK on GET /health. Serve another model by mounting it and
# passing --model, e.g. -v /models:/models kvserve:cuda serve --model /models/x
# --host 0.0.0.0 --device cuda. The API key goes in KVSERVE_API_KEY (-e).

ARG CUDA_VERSION=12.6.3
ARG UBUNTU_VERSION=24.04

# ---------------------------------------------------------------------------
# CPU-only image: build on debian:12, run on debian:12-slim.
FROM debian:12 AS build-cpu
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      gcc pkg-config meson ninja-build libmicrohttpd-dev libuv1-dev libcjson-dev \
      libopenblas-dev libpcre2-dev libssl-dev libsystemd-dev libinih-dev \
      libzmq3-dev libmsgpack-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN meson setup /build -Dcuda=disabled -Dbuildtype=release \
 && meson compile -C /build kvserve \
 && mkdir -p /out/bin /out/lib /out/share/kvserve/models \
 && cp /build/cli/kvserve /out/bin/ \
 && ldd /build/cli/kvserve | awk '$2 == "=>" && $3 ~ /^\// {print $3}' \
      | grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' \
      | xargs -r cp -L -t /out/lib/ \
 && cp -r models/austen-2.7m /out/share/kvserve/models/

FROM debian:12-slim AS cpu
COPY --from=build-cpu /out/bin/kvserve /usr/local/bin/kvserve
COPY --from=build-cpu /out/lib/ /usr/local/lib/kvserve/
COPY --from=build-cpu /out/share/kvserve/ /usr/share/kvserve/
RUN echo /usr/local/lib/kvserve > /etc/ld.so.conf.d/kvserve.conf && ldconfig \
 && useradd --system --no-create-home --home-dir /usr/share/kvserve \
      --shell /usr/sbin/nologin kvserve
USER kvserve
WORKDIR /usr/share/kvserve
EXPOSE 8000
# bash's /dev/tcp keeps curl out of the image.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8000 && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kvserve"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--model", "/usr/share/kvserve/models/austen-2.7m"]

# ---------------------------------------------------------------------------
# CUDA image (the default target): build with nvcc on the devel image, run on
# the matching runtime image.
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build-cuda
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      gcc pkg-config meson ninja-build libmicrohttpd-dev libuv1-dev libcjson-dev \
      libopenblas-dev libpcre2-dev libssl-dev libsystemd-dev libinih-dev \
      libzmq3-dev libmsgpack-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN meson setup /build -Dcuda=enabled -Dbuildtype=release \
 && meson compile -C /build kvserve \
 && mkdir -p /out/bin /out/lib /out/share/kvserve/models \
 && cp /build/cli/kvserve /out/bin/ \
 && ldd /build/cli/kvserve | awk '$2 == "=>" && $3 ~ /^\// {print $3}' \
      | grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' \
      | grep -Ev '/(libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' \
      | xargs -r cp -L -t /out/lib/ \
 && cp -r models/austen-2.7m /out/share/kvserve/models/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS cuda
COPY --from=build-cuda /out/bin/kvserve /usr/local/bin/kvserve
COPY --from=build-cuda /out/lib/ /usr/local/lib/kvserve/
COPY --from=build-cuda /out/share/kvserve/ /usr/share/kvserve/
RUN echo /usr/local/lib/kvserve > /etc/ld.so.conf.d/kvserve.conf && ldconfig \
 && useradd --system --no-create-home --home-dir /usr/share/kvserve \
      --shell /usr/sbin/nologin kvserve
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER kvserve
WORKDIR /usr/share/kvserve
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8000 && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kvserve"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--device", "cuda", "--model", "/usr/share/kvserve/models/austen-2.7m"]
