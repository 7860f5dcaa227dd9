# Sluice's container image: built with cargo, run from a distroless base as the nonroot user.
# Untested here (no container engine on the project's machines); see README.
#
#   docker build -t sluice:0.1.0 .
#   docker run --rm -p 8080:8080 -p 8081:8081 -p 6070:6070 sluice:0.1.0
#
# The image serves /config (the repository's config/) by default; Kubernetes mounts its own
# descriptor files and sets SLUICE_CONFIG (helm/sluice).

FROM rust:1-bookworm AS build
WORKDIR /src
# The whole context (see .dockerignore): Cargo.toml names test and bench files by path.
COPY . .
RUN cargo build --release --locked --bin sluice

# glibc and libgcc, no shell, no package manager; uid/gid 65532 ("nonroot").
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/sluice /sluice
# envoyproxy/ratelimit's path: Envoy Gateway (and other charts made for the Go service) run the
# command /bin/ratelimit, so the same image stands in for theirs unchanged.
COPY --from=build /src/target/release/sluice /bin/ratelimit
COPY config/ /config/
# ./config is the default config path when neither SLUICE_CONFIG nor RUNTIME_ROOT is set.
WORKDIR /
USER nonroot
# HTTP (/json, /healthcheck), gRPC (ratelimit.v3, health), debug (/rlconfig, /stats), peers.
EXPOSE 8080 8081 6070 8082
ENTRYPOINT ["/sluice"]
