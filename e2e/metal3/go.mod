// Pins metal3's baremetal-operator, whose source tree carries the genuine
// BareMetalHost CRD (config/base/crds/bases/metal3.io_baremetalhosts.yaml)
// that crd.sh hands to the tests. Nothing is built from it, so go.sum only
// needs the module's own two lines and no Go file imports it: do not run
// `go mod tidy` here (with no import it would drop the requirement).
module github.com/nodewarden/nodewarden/e2e/metal3

go 1.25.0

require github.com/metal3-io/baremetal-operator v0.13.2
