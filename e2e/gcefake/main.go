// Command gcefake is a local stand-in for the parts of the Compute Engine v1
// API that nodewarden's GCP provider calls (instance templates, zonal managed
// instance groups, instances, disks, operations), plus Google's OAuth token
// endpoint and the GCE metadata server's token, so the provider's REST and
// token code can be tested end to end without Google. Request and response
// bodies are the generated google.golang.org/api/compute/v1 types, so the wire
// JSON is the real API's. See README.md.
package main

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
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
	boot            time.Duration // PROVISIONING -> STAGING at boot/2 -> RUNNING at boot
	stop            time.Duration // a deleted instance is STOPPING this long, then gone
	opDelay         time.Duration // an operation is RUNNING this long, then DONE
	projectNumber   uint64
	requireToken    bool
	tokenTTL        time.Duration
	saPublicKey     *rsa.PublicKey // verifies JWT-bearer assertions at /token
	metadataProject string
	logFile         io.Writer // one JSON line per request; nil: none
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	cfg := config{}
	flag.DurationVar(&cfg.boot, "boot", 300*time.Millisecond, "time from PROVISIONING to RUNNING (STAGING at half)")
	flag.DurationVar(&cfg.stop, "stop", 300*time.Millisecond, "time a deleted instance stays STOPPING before it is gone")
	flag.DurationVar(&cfg.opDelay, "op-delay", 200*time.Millisecond, "time an operation stays RUNNING before it reads DONE")
	flag.Uint64Var(&cfg.projectNumber, "project-number", 123456789012, "the number every project has")
	flag.BoolVar(&cfg.requireToken, "require-token", false, "compute calls need a bearer token this fake issued")
	flag.DurationVar(&cfg.tokenTTL, "token-ttl", 3599*time.Second, "lifetime of issued tokens (expires_in)")
	keyFile := flag.String("sa-public-key", "", "PEM RSA public key (or certificate) that signs JWT-bearer assertions")
	flag.StringVar(&cfg.metadataProject, "metadata-project", "fake-project", "project id the metadata server reports")
	logPath := flag.String("log", "", "append one JSON line per request to this file")
	flag.Parse()

	if err := loadFiles(&cfg, *keyFile, *logPath); err != nil {
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

// loadFiles reads the public key and opens the request log named by flags.
func loadFiles(cfg *config, keyFile, logPath string) error {
	if keyFile != "" {
		key, err := readPublicKey(keyFile)
		if err != nil {
			return fmt.Errorf("-sa-public-key: %w", err)
		}
		cfg.saPublicKey = key
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

// readPublicKey accepts a PKIX "PUBLIC KEY", a PKCS#1 "RSA PUBLIC KEY" or a
// "CERTIFICATE" (Google publishes service-account keys as certificates).
func readPublicKey(path string) (*rsa.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var pub any
	switch block.Type {
	case "RSA PUBLIC KEY":
		pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
			pub = cert.PublicKey
		}
	default:
		pub, err = x509.ParsePKIXPublicKey(block.Bytes)
	}
	if err != nil {
		return nil, err
	}
	key, ok := pub.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("not an RSA key: %T", pub)
	}
	return key, nil
}
