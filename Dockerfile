# sluice's container image: one static binary on distroless/static, run as
# the unprivileged user 65532.
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t sluice .
#   docker run --rm -p 8080:8080 sluice                      # embedded default policy
#   docker run --rm -p 8080:8080 -v "$PWD/policy.yaml:/etc/sluice/policy.yaml:ro" \
#       sluice serve --config /etc/sluice/policy.yaml
#
# .ci/image builds the same image without a Docker daemon (same build flags,
# same entrypoint, user and ports, read from this file) and runs the binary
# from its layer. cmd/sluice/packaging_test.go checks the rules below.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# .dockerignore leaves out .git, so Go cannot stamp the commit: VERSION
# names the build ("sluice version"). Left empty, it reads "dev".
ARG VERSION=""
# Static (no libc: the final image has none) and without the build
# machine's paths. The tag vtprotobuf compiles in go-control-plane's
# generated marshalling, which the Envoy rate limit service answers with
# (see envoyrls.ServerOptions).
RUN CGO_ENABLED=0 go build -trimpath -tags vtprotobuf -ldflags "-s -w -X main.version=${VERSION}" -o /out/sluice ./cmd/sluice

# distroless/static: CA certificates (rediss://, PostgreSQL over TLS),
# tzdata, /etc/passwd with the nonroot user, /tmp; no shell, no package
# manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /sluice
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading
# /etc/passwd.
USER 65532:65532
# 8080: decision API, forward auth, /metrics, /healthz, /readyz.
# 8081: Envoy's gRPC rate limit service.
EXPOSE 8080 8081
# No HEALTHCHECK: it would need a shell or an HTTP client inside the image,
# and this one has neither. Probe GET /healthz (alive) and GET /readyz
# (ready: the store answers; fails while draining) from outside, as
# examples/kubernetes/deployment.yaml and examples/compose.yaml do.
ENTRYPOINT ["/sluice"]
CMD ["serve"]
