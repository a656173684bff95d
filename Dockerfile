# nodewarden: a static binary on an empty base image, run as a non-root user.
# The image also holds the sim-cloud (/nodewarden-simcloud), which e2e/kind
# runs, and a CA bundle for the AWS APIs and Plan channels over HTTPS.
# `just image` builds the same layout without Docker (e2e/image/build.sh), and
# `just image-check` compares this file's final stage with what it built.
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev ca-certificates
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
COPY benches ./benches
RUN CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release --locked \
    --bin nodewarden --bin nodewarden-simcloud

FROM scratch
COPY --from=build /src/target/release/nodewarden /nodewarden
COPY --from=build /src/target/release/nodewarden-simcloud /nodewarden-simcloud
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
USER 65532:65532
ENTRYPOINT ["/nodewarden"]
CMD ["run"]
