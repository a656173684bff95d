# nodewarden: a static binary on an empty base image, run as a non-root user.
# The image also holds the sim-cloud (/nodewarden-simcloud), which e2e/kind runs.
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin nodewarden --bin nodewarden-simcloud \
    && strip target/release/nodewarden target/release/nodewarden-simcloud

FROM scratch
COPY --from=build /src/target/release/nodewarden /nodewarden
COPY --from=build /src/target/release/nodewarden-simcloud /nodewarden-simcloud
USER 65532:65532
ENTRYPOINT ["/nodewarden"]
CMD ["run"]
