//go:build tools

// Package jaeger pins the Jaeger v2 all-in-one binary that nodewarden's
// tracing tests run as a local process. Nothing here is compiled into
// nodewarden; `go build` of the imported main package is driven by build.sh.
package jaeger

import (
	_ "github.com/jaegertracing/jaeger/cmd/jaeger"
)
