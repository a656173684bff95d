# nodewarden: a static binary on an empty base image, run as a non-root user.
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin nodewarden \
    && strip target/release/nodewarden

FROM scratch
COPY --from=build /src/target/release/nodewarden /nodewarden
USER 65532:65532
ENTRYPOINT ["/nodewarden"]
CMD ["run"]
