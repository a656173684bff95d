// Pins go-containerregistry, whose validators check the image archive that
// `just image` writes (check.sh builds this into the cache outside the
// repository). go.sum was made with
//   GOTOOLCHAIN=local go get github.com/google/go-containerregistry@v0.22.1 && go mod tidy
module github.com/nodewarden/nodewarden/e2e/image/validate

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
