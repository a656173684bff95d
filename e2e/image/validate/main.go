// Command validate reads an image archive written by e2e/image/oci.py the two
// ways loaders read it, with go-containerregistry's validators: as an OCI image
// layout (what skopeo's oci-archive and containerd's import read) and as a
// `docker save` tarball through its manifest.json (what `docker load` reads).
// Each checks every blob's digest and size, and each layer's diff ID.
//
//	validate <unpacked-archive-dir> <archive.tar> <repository:tag>
package main

import (
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

func main() {
	if len(os.Args) != 4 {
		fail("usage: validate <unpacked-archive-dir> <archive.tar> <repository:tag>")
	}
	dir, archive, ref := os.Args[1], os.Args[2], os.Args[3]

	index, err := layout.ImageIndexFromPath(dir)
	check("reading the OCI layout", err)
	check("validating the OCI layout", validate.Index(index))
	manifest, err := index.IndexManifest()
	check("reading index.json", err)
	for _, m := range manifest.Manifests {
		fmt.Printf("oci layout: %s %s/%s %s\n", m.Digest, m.Platform.OS, m.Platform.Architecture,
			m.Annotations["io.containerd.image.name"])
	}

	tag, err := name.NewTag(ref, name.StrictValidation)
	check("parsing "+ref, err)
	image, err := tarball.ImageFromPath(archive, &tag)
	check("reading the docker-save manifest.json for "+ref, err)
	check("validating the docker-save form", validate.Image(image))
	digest, err := image.Digest()
	check("digest", err)
	fmt.Printf("docker save: %s %s\n", ref, digest)
}

func check(what string, err error) {
	if err != nil {
		fail(what + ": " + err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "validate: "+msg)
	os.Exit(1)
}
