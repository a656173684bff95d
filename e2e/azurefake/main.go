// Command azurefake is a local stand-in for the parts of Azure Resource
// Manager's compute API that nodewarden's Azure provider calls (virtual
// machine scale sets, their VMs and instance views, long-running operations),
// plus Azure AD's token endpoint and the managed-identity (IMDS) token
// endpoint, so the provider's REST and token code can be tested end to end
// without Azure. Request and response bodies are the generated
// github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v6
// model types, so the wire JSON is ARM's. See README.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"
)

// config is what the flags set; tests build one directly.
type config struct {
	boot           time.Duration // a new VM is Creating this long, then Succeeded
	stop           time.Duration // a deleted VM is Deleting this long, then gone
	opDelay        time.Duration // an operation is InProgress this long, then Succeeded
	retryAfter     int           // seconds, the Retry-After of LRO answers and InProgress polls
	pageSize       int           // items per list page
	requireToken   bool
	tokenTTL       time.Duration
	clientSecret   string    // the one secret the client-secret grant accepts; "": any
	federatedToken string    // the one client_assertion the workload-identity grant accepts; "": any
	logFile        io.Writer // one JSON line per request; nil: none
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	cfg := config{}
	flag.DurationVar(&cfg.boot, "boot", 300*time.Millisecond, "time a new VM stays Creating (power starting) before it is Succeeded and running")
	flag.DurationVar(&cfg.stop, "stop", 300*time.Millisecond, "time a deleted VM stays Deleting before it is gone")
	flag.DurationVar(&cfg.opDelay, "op-delay", 200*time.Millisecond, "time an operation stays InProgress before it is Succeeded")
	flag.IntVar(&cfg.retryAfter, "retry-after", 0, "Retry-After (whole seconds) of LRO answers and InProgress polls")
	flag.IntVar(&cfg.pageSize, "page-size", 50, "items per list page (nextLink when more)")
	flag.BoolVar(&cfg.requireToken, "require-token", false, "ARM calls need a bearer token this fake issued")
	flag.DurationVar(&cfg.tokenTTL, "token-ttl", 3599*time.Second, "lifetime of issued tokens (expires_in)")
	flag.StringVar(&cfg.clientSecret, "client-secret", "", "the only client_secret the token endpoint accepts (empty: any non-empty)")
	flag.StringVar(&cfg.federatedToken, "federated-token", "", "the only client_assertion the token endpoint accepts (empty: any non-empty)")
	logPath := flag.String("log", "", "append one JSON line per request to this file")
	flag.Parse()

	if err := checkConfig(&cfg, *logPath); err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// The one line a starting script waits for; stdout is unbuffered in Go,
	// Sync only matters when it is a file.
	fmt.Printf("listening on http://%s\n", ln.Addr())
	_ = os.Stdout.Sync()
	srv := &http.Server{Handler: newServer(cfg), ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.Serve(ln))
}

// checkConfig rejects flag values that make no sense and opens the request
// log named by -log.
func checkConfig(cfg *config, logPath string) error {
	if cfg.pageSize < 1 {
		return errors.New("-page-size must be at least 1")
	}
	if cfg.retryAfter < 0 {
		return errors.New("-retry-after must not be negative")
	}
	if logPath != "" {
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("-log: %w", err)
		}
		cfg.logFile = f
	}
	return nil
}
